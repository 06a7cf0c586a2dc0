"""The Chrome / Perfetto trace: valid JSON holding one complete slice per event."""

from __future__ import annotations

import json
from pathlib import Path

from dlio_ckpt.storage.events import OPS, PHASES
from dlio_ckpt.trace.chrome import write_chrome_trace
from trace_events import two_rank_job


def test_trace_holds_every_event_as_a_complete_slice(tmp_path: Path):
    ranks = two_rank_job(tmp_path / "fs")
    path = write_chrome_trace(tmp_path / "trace.json", ranks, metadata={"run_id": "r1"})
    trace = json.loads(path.read_text())
    assert trace["otherData"]["run_id"] == "r1"
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(slices) == sum(len(r.events) for r in ranks)
    for rank in ranks:
        mine = [e for e in slices if e["pid"] == rank.rank]
        assert len(mine) == len(rank.events)
        for event, row in zip(mine, rank.events):
            assert event["name"] == OPS[row["op"]] and event["cat"] == PHASES[row["phase"]]
            assert event["tid"] == int(row["phase"])
            assert event["ts"] == round(float(row["start"]) * 1e6, 3)
            assert event["dur"] == round(float(row["end"] - row["start"]) * 1e6, 3)
            assert event["args"]["file"] == rank.paths[row["file"]]
            if OPS[row["op"]] in ("read", "write"):
                assert (event["args"]["offset"], event["args"]["length"]) == (int(row["offset"]), int(row["length"]))
            else:
                assert "length" not in event["args"]
    bytes_read = sum(e["args"]["length"] for e in slices if e["name"] == "read")
    assert bytes_read == sum(int(r.events["length"][r.events["op"] == OPS.index("read")].sum()) for r in ranks)


def test_ranks_and_phases_are_named(tmp_path: Path):
    ranks = two_rank_job(tmp_path / "fs")
    trace = json.loads(write_chrome_trace(tmp_path / "t.json", ranks).read_text())
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {(0, "rank 0 (node0)"), (1, "rank 1 (node1)")}
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert threads == set(PHASES)
    assert not list(tmp_path.glob("*.partial"))
