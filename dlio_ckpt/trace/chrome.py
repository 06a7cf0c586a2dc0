"""A Chrome / Perfetto trace (JSON) of a run's events, for looking at the timeline by eye.

Open it in https://ui.perfetto.dev or chrome://tracing: one process per rank, one thread per
phase (generate, train, eval, checkpoint, restore, other), one complete ("X") slice per storage
operation with its file, offset and length. Runs can have tens of millions of events and paths,
so the file is written one event at a time (never one big object in memory), to a temporary name
renamed at the end, and the events come from each rank's event file a block at a time with only
the paths that block names (`EventFile.blocks`): what the writer holds does not grow with the run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence, TextIO, Union

import numpy as np

from dlio_ckpt.storage.events import OPS, PHASES, EventFile, RankEvents

_CHUNK = 65536  # events converted to Python objects at a time
# json.dumps(event, separators=(",", ":")) without building an encoder per event (the same text)
_encode = json.JSONEncoder(separators=(",", ":")).encode

# A block of one rank's events and what names their files by index: {index: path} for a block
# read from an event file, the rank's whole path list for events already in memory.
Block = tuple[np.ndarray, Union[Mapping[int, str], Sequence[str]]]


def _metadata_events(rank: int, hostname: str) -> Iterator[dict]:
    yield {"name": "process_name", "ph": "M", "pid": rank, "tid": 0,
           "args": {"name": f"rank {rank} ({hostname})"}}
    yield {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}}
    for code, phase in enumerate(PHASES):
        yield {"name": "thread_name", "ph": "M", "pid": rank, "tid": code, "args": {"name": phase}}
        yield {"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": code, "args": {"sort_index": code}}


def _slices(rank: int, blocks: Iterable[Block]) -> Iterator[dict]:
    """One complete event per operation; times in microseconds since the job started."""
    for events, names in blocks:
        for first in range(0, len(events), _CHUNK):
            chunk = events[first : first + _CHUNK]
            for op, phase, file_index, offset, length, start, end in zip(
                chunk["op"].tolist(), chunk["phase"].tolist(), chunk["file"].tolist(), chunk["offset"].tolist(),
                chunk["length"].tolist(), chunk["start"].tolist(), chunk["end"].tolist(),
            ):
                args: dict = {"file": names[file_index]}
                if offset >= 0:
                    args["offset"] = offset
                if OPS[op] in ("read", "write"):
                    args["length"] = length
                yield {"name": OPS[op], "cat": PHASES[phase], "ph": "X", "ts": round(start * 1e6, 3),
                       "dur": round(max(end - start, 0.0) * 1e6, 3), "pid": rank, "tid": phase, "args": args}


def _write_events(out: TextIO, ranks: Sequence[RankEvents | EventFile]) -> int:
    count = 0
    separator = "\n"
    for rank in ranks:
        blocks = rank.blocks() if isinstance(rank, EventFile) else [(rank.events, rank.paths)]
        for source in (_metadata_events(rank.rank, rank.hostname), _slices(rank.rank, blocks)):
            for event in source:
                out.write(separator)
                out.write(_encode(event))
                separator = ",\n"
                count += 1
        if isinstance(rank, EventFile):
            rank.close()  # one rank's file open at a time
    return count


def write_chrome_trace(path: Path | str, ranks: Sequence[RankEvents | Path | str], metadata: dict | None = None) -> Path:
    """Write the trace of `ranks` to `path` (JSON object format) and return the path. `ranks` are
    event files (paths: read a block at a time, what a run's end passes) or events already loaded
    (RankEvents); either way the same trace. An event file that fails part-way (an event naming a
    path past its table) leaves no partial trace behind."""
    target = Path(path)
    partial = target.with_name(target.name + ".partial")
    opened = [EventFile(rank) if isinstance(rank, (str, Path)) else rank for rank in ranks]
    try:
        ordered = sorted(opened, key=lambda r: r.rank)
        with open(partial, "w", encoding="utf-8") as out:
            out.write('{"displayTimeUnit":"ms","otherData":')
            out.write(json.dumps({"generator": "dlio_ckpt", **(metadata or {})}, default=str))
            out.write(',"traceEvents":[')
            _write_events(out, ordered)
            out.write("\n]}\n")
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        for rank in opened:
            if isinstance(rank, EventFile):
                rank.close()
    os.replace(partial, target)
    return target
