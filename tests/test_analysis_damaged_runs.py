"""dlio_ckpt-analyze on a run folder whose summary.json or event files are damaged (issue 24).

Each case used to end in a traceback (AttributeError on a string `checkpoint`, BadZipFile on a cut
event file, IndexError on an event naming a path the file does not hold, ...). Now each is one
line naming the file and the field or problem, exit code 2, and nothing written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dlio_ckpt.analysis.cli import main
from test_analysis import make_run

SUMMARY_DAMAGE = {
    "checkpoint is a string": (lambda s: s.update(checkpoint="oops"), "field checkpoint is a string"),
    "train is a list": (lambda s: s.update(train=[1, 2]), "field train is a list"),
    "policy is a string": (lambda s: s["checkpoint"].update(policy="every 10"), "field checkpoint.policy is a string"),
    "bytes read is text": (lambda s: s["io"].update(bytes_read="many"), "field io.bytes_read is a string"),
    "warnings is a number": (lambda s: s.update(warnings=5), "field warnings is an integer"),
    "traces is a string": (lambda s: s.update(traces="events"), "field traces is a string"),
    "a rank is a string": (lambda s: s["ranks"].__setitem__(0, "rank 0"), "ranks[0] is a string"),
    "a rank's samples are text": (lambda s: s["ranks"][1].update(samples="4"), "ranks[1].samples is a string"),
    "samples per second is true": (lambda s: s["train"].update(samples_per_s=True), "train.samples_per_s is a boolean"),
}


def refused(capsys, folder: Path, expected: str, names: str) -> None:
    before = sorted(p.name for p in folder.parent.iterdir())
    assert main([str(folder), "--json", "--no-plots"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlio_ckpt-analyze: error:"), captured.err
    assert names in lines[0] and expected in lines[0], lines[0]
    assert captured.out == "" and sorted(p.name for p in folder.parent.iterdir()) == before


@pytest.mark.parametrize("case", sorted(SUMMARY_DAMAGE))
def test_a_summary_field_of_the_wrong_type_is_one_line(tmp_path, capsys, case):
    run = tmp_path / "run"
    make_run(run)
    summary = json.loads((run / "summary.json").read_text())
    damage, expected = SUMMARY_DAMAGE[case]
    damage(summary)
    (run / "summary.json").write_text(json.dumps(summary))
    refused(capsys, run, expected, "summary.json")


def _rewrite(path: Path, **arrays) -> None:
    with np.load(path, allow_pickle=False) as data:
        contents = {key: data[key] for key in data.files}
    contents.update(arrays)
    np.savez(path, **contents)


EVENT_DAMAGE = {
    "random bytes": (lambda p: p.write_bytes(bytes(range(256)) * 8), "not a dlio_ckpt event file"),
    "empty": (lambda p: p.write_bytes(b""), "not a dlio_ckpt event file"),
    "cut": (lambda p: p.write_bytes(p.read_bytes()[:500]), "not a dlio_ckpt event file"),
    "no meta": (lambda p: np.savez(p, events=np.zeros(1)), "not a dlio_ckpt event file"),
    "other layout": (lambda p: _rewrite(p, events=np.zeros(3)), "layout"),
    "file past the paths": (lambda p: _rewrite(p, path_bytes=np.frombuffer(b"/only/one", np.uint8),
                                               path_ends=np.array([9])), "past its 1 paths"),
    "path table past its bytes": (lambda p: _rewrite(p, path_ends=np.array([10**6])), "path table does not hold together"),
    "old unicode path table": (lambda p: _rewrite_old_format(p, ["/only/one"]), "past its 1 paths"),
    "unknown op": (lambda p: _rewrite(p, events=_with(p, "op", 200)), "codes this version does not know"),
    "negative length": (lambda p: _rewrite(p, events=_with(p, "length", -5)), "negative byte counts"),
    "infinite time": (lambda p: _rewrite(p, events=_with(p, "end", np.inf)), "not finite"),
}


def _rewrite_old_format(path: Path, paths: list[str]) -> None:
    """The event file as versions before the byte path table wrote it (a unicode `paths` array),
    which RankEvents still reads."""
    with np.load(path, allow_pickle=False) as data:
        contents = {key: data[key] for key in data.files if key not in ("path_bytes", "path_ends")}
    np.savez(path, **contents, paths=np.array(paths))


def _with(path: Path, field: str, value) -> np.ndarray:
    with np.load(path, allow_pickle=False) as data:
        events = data["events"].copy()
    events[field][-1] = value
    return events


@pytest.mark.parametrize("case", sorted(EVENT_DAMAGE))
def test_a_damaged_event_file_is_one_line(tmp_path, capsys, case):
    run = tmp_path / "run"
    make_run(run)
    target = run / "events" / "rank-00001.npz"
    damage, expected = EVENT_DAMAGE[case]
    damage(target)
    refused(capsys, run, expected, "rank-00001.npz")


def test_two_event_files_of_one_rank_are_refused(tmp_path, capsys):
    run = tmp_path / "run"
    make_run(run)
    (run / "events" / "rank-00002.npz").write_bytes((run / "events" / "rank-00001.npz").read_bytes())
    refused(capsys, run, "holds the events of rank 1", "rank-00002.npz")


def test_an_undamaged_run_still_reads(tmp_path, capsys):
    run = tmp_path / "run"
    figures = make_run(run)
    assert main([str(run), "--json", "--no-plots"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["bytes_read"], doc["bytes_written"]) == (figures["bytes_read"], figures["bytes_written"])
