"""reader.workers=processes (engine/workers.py) and npz read as np.load(path) reads (storage/streams.py).

The worker processes' I/O must reach the rank's events exactly: the calls the processes really
made (strace -f, where installed) and the events recorded agree call for call and byte for byte.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from conftest import BIN, cli_env, load_summary, run_cli
from dlio_ckpt.content import ByteSource
from dlio_ckpt.engine import workers as workers_module
from dlio_ckpt.engine.workers import ProcessReader
from dlio_ckpt.formats import FileSpec, FormatOptions, get_format
from dlio_ckpt.plan.read import EpochReadPlan
from dlio_ckpt.plan.read_order import ListedOrder
from dlio_ckpt.storage import events as events_module
from dlio_ckpt.storage.events import OPS, EventRecorder, JobClock
from dlio_ckpt.storage.posix import PosixStorage
from dlio_ckpt.storage.streams import open_buffered
from dlio_ckpt.storage.traced import TracedStorage

SAMPLES, SAMPLE_BYTES, FILES = 3, 5000, 4


@pytest.fixture
def dataset(tmp_path):
    source = ByteSource(seed=7, pool_bytes=1 << 20)
    specs = []
    for index in range(FILES):
        spec = FileSpec(index=index, path=str(tmp_path / f"f{index}.npz"), num_samples=SAMPLES, sample_bytes=SAMPLE_BYTES)
        handle = PosixStorage().open_write(spec.path)
        get_format("npz").write(lambda suffix, h=handle: h, spec, source, FormatOptions())
        handle.close()
        specs.append(spec)
    return tuple(specs)


def whole_plan(specs, batch_size=2, epoch=1, seed=5):
    rows = np.array([(f, s) for f in range(len(specs)) for s in range(specs[f].num_samples)], dtype=np.int64)
    rows = rows[np.random.default_rng(seed + epoch).permutation(len(rows))]
    return EpochReadPlan(epoch=epoch, rank=0, order=ListedOrder(rows), batch_size=batch_size, drop_last=False)


def traced():
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    return TracedStorage(PosixStorage(), recorder, phase="train"), recorder


def op_count(events, op):
    return int((events["op"] == OPS.index(op)).sum())


def make_reader(storage, specs, workers=2, persistent=False, decode="none", npz_reads="np_load"):
    return ProcessReader(storage, get_format("npz"), FormatOptions(npz_reads=npz_reads), specs, workers, prefetch=2,
                         persistent=persistent, decode=decode)


def shm_leftovers():
    return glob.glob(f"/dev/shm/dlio_ckpt-{os.getpid()}-*")


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_come_in_order_and_every_worker_call_reaches_the_events(dataset, workers):
    storage, recorder = traced()
    reader = make_reader(storage, dataset, workers=workers)
    plan = whole_plan(dataset)
    batches = list(reader.batches(plan))
    assert [b.samples for b in batches] == [len(plan.batch(i)) for i in range(plan.num_batches)]
    assert sum(b.payload_bytes for b in batches) == FILES * SAMPLES * SAMPLE_BYTES
    events = recorder.array()
    # every file a worker opened it closed, and the close (sent with its exit message) was absorbed
    assert op_count(events, "open") == op_count(events, "close") >= FILES
    # np.load's calls: each opening of a file reads it whole (buffered reads, lseeks, header re-reads)
    opens = Counter(recorder.paths[f] for f in events["file"][events["op"] == OPS.index("open")])
    reads = events[events["op"] == OPS.index("read")]
    for spec in dataset:
        mine = reads[np.array([recorder.paths[f] == spec.path for f in reads["file"]])]
        assert opens[spec.path] >= 1
        assert int(mine["length"].sum()) > opens[spec.path] * os.path.getsize(spec.path)  # whole, headers twice
    assert reader.stats.times.batches == plan.num_batches
    assert reader.stats.worker_starts == workers
    assert not shm_leftovers()


def test_worker_messages_name_their_own_paths_past_every_cache(tmp_path, monkeypatch):
    """40 files of 3 samples read shuffled by 2 workers, with a recorder cache of 4 paths and 12
    names kept a worker (a 10M-file epoch's situation, small): each message names its events'
    files itself, so every open, read and close the parent absorbed is of the file it was, and
    neither side keeps a path per file."""
    monkeypatch.setattr(events_module, "PATH_CACHE", 4)
    monkeypatch.setattr(workers_module, "NAMES_KEPT", 12)
    source = ByteSource(seed=7, pool_bytes=1 << 20)
    specs = []
    for index in range(40):
        spec = FileSpec(index=index, path=str(tmp_path / f"f{index}.npz"), num_samples=SAMPLES, sample_bytes=SAMPLE_BYTES)
        handle = PosixStorage().open_write(spec.path)
        get_format("npz").write(lambda suffix, h=handle: h, spec, source, FormatOptions())
        handle.close()
        specs.append(spec)
    storage, recorder = traced()
    reader = make_reader(storage, tuple(specs), workers=2)
    plan = whole_plan(specs, batch_size=3)
    assert sum(b.samples for b in reader.batches(plan)) == 40 * SAMPLES
    events = recorder.array()
    paths = recorder.paths
    named = [paths[f] for f in events["file"]]
    assert set(named) == {spec.path for spec in specs}
    opens = Counter(p for p, op in zip(named, events["op"]) if op == OPS.index("open"))
    closes = Counter(p for p, op in zip(named, events["op"]) if op == OPS.index("close"))
    assert opens == closes and sum(opens.values()) >= 40
    for spec in specs:  # each opening read its file whole: the reads absorbed under its name are its
        read = sum(int(e["length"]) for e, p in zip(events, named) if p == spec.path and e["op"] == OPS.index("read"))
        assert read > opens[spec.path] * os.path.getsize(spec.path)
    assert not shm_leftovers()


def test_worker_processes_are_forked_per_epoch_unless_persistent(dataset):
    for persistent, starts in ((False, 4), (True, 2)):
        storage, recorder = traced()
        reader = make_reader(storage, dataset, workers=2, persistent=persistent)
        for epoch in (1, 2):
            assert sum(b.samples for b in reader.batches(whole_plan(dataset, epoch=epoch))) == FILES * SAMPLES
        reader.close()
        assert reader.stats.worker_starts == starts
        events = recorder.array()
        assert op_count(events, "open") == op_count(events, "close")
        assert reader.stats.worker_start_s > 0
    assert not multiprocessing_children()


def multiprocessing_children():
    import multiprocessing

    return [p for p in multiprocessing.active_children() if p.name.startswith("reader-")]


def test_an_epoch_cut_short_stops_the_workers_and_keeps_the_reads_they_made(dataset):
    storage, recorder = traced()
    reader = make_reader(storage, dataset, workers=2, persistent=True)
    batches = reader.batches(whole_plan(dataset))
    next(batches)
    batches.close()  # the training loop stopped (total_steps): prefetched batches are dropped
    assert not multiprocessing_children() and not shm_leftovers()
    events = recorder.array()
    assert op_count(events, "open") == op_count(events, "close") >= 1
    assert reader.stats.times.batches >= 1


def test_a_worker_failure_is_raised_where_the_loop_waits(dataset):
    with open(dataset[1].path, "r+b") as damaged:
        damaged.truncate(100)
    storage, _ = traced()
    reader = make_reader(storage, dataset, workers=2)
    plan = EpochReadPlan(epoch=1, rank=0, order=ListedOrder(np.array([(0, 0), (1, 0)])), batch_size=1, drop_last=False)
    with pytest.raises(Exception) as info:
        list(reader.batches(plan))
    assert "zip" in str(info.value).lower() or "file" in str(info.value).lower()
    assert not multiprocessing_children() and not shm_leftovers()


def test_decode_numpy_is_timed_apart_from_the_fetch(dataset):
    storage, _ = traced()
    reader = make_reader(storage, dataset, workers=0, decode="numpy")
    list(reader.batches(whole_plan(dataset)))
    times = reader.stats.times
    assert times.decode_s > 0 and times.fetch_s > 0 and times.collate_s > 0
    plain = make_reader(traced()[0], dataset, workers=0)
    list(plain.batches(whole_plan(dataset)))
    assert plain.stats.times.decode_s == 0


def test_np_load_mode_makes_the_calls_of_np_load_on_a_path(dataset, tmp_path):
    """The sequence of reads (offset, length) and seeks (resulting offset) is np.load(path)'s,
    as FileIO makes them: checked against strace of the real np.load where strace is installed,
    else against the calls a FileIO-backed BufferedReader makes (io.open's)."""
    path = dataset[0].path
    storage, recorder = traced()
    handle = storage.open_read(path)
    with np.load(open_buffered(handle)) as archive:
        ours = archive["x"]
    handle.close()
    with np.load(path) as archive:
        assert np.array_equal(ours, archive["x"])
    events = recorder.array()
    calls = [(OPS[op], int(offset), int(length)) for op, offset, length in zip(events["op"], events["offset"], events["length"])
             if OPS[op] in ("read", "seek")]
    assert ("read", 0, 4096) in calls and sum(1 for c in calls if c[0] == "seek") > 5
    assert sum(length for op, _, length in calls if op == "read") > os.path.getsize(path)  # header re-reads
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed: the calls were not compared with np.load's own")
    script = f"import numpy as np\nwith np.load({path!r}) as a:\n    a['x']\n"
    trace = tmp_path / "np_load.strace"
    subprocess.run(["strace", "-f", "-y", "-o", str(trace), "-e", "trace=read,readv,pread64,preadv,lseek",
                    sys.executable, "-c", script], check=True)
    real = []
    for line in trace.read_text().splitlines():
        match = re.search(r"(read|readv|pread64|preadv|lseek)\((\d+)<([^>]*)>, (.*)\) += (-?\d+)", line)
        if not match or match.group(3) != os.path.realpath(path):
            continue
        call, result = match.group(1), int(match.group(5))
        real.append(("seek", result) if call == "lseek" else ("read", result))
    mine = []
    for op, offset, length in calls:
        mine.append(("seek", offset) if op == "seek" else ("read", length))
    assert mine == real


def test_zip_pread_mode_keeps_one_pread_per_zipfile_read(dataset):
    storage, recorder = traced()
    reader = make_reader(storage, dataset, workers=0, npz_reads="zip_pread")
    list(reader.batches(whole_plan(dataset)))
    events = recorder.array()
    assert op_count(events, "seek") == 0 and op_count(events, "read") > 0


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_run_with_worker_processes_agrees_with_strace(workdir):
    """summary.json's train reads and bytes are the read calls the worker processes made (strace -ff)."""
    root, run = workdir / "store", workdir / "run"
    args = ["workload=unet3d", "scale=tiny", "progress=false", "checkpoint.enabled=false", "reader.read_threads=2",
            "train.epochs=2", f"storage.root={root}"]
    # the dataset generated first, untraced
    assert run_cli(args + ["train.epochs=1", f"hydra.run.dir={workdir / 'first'}"], workdir / "cwd").returncode == 0
    args.append(f"hydra.run.dir={run}")
    trace = workdir / "run.strace"
    done = subprocess.run(["strace", "-ff", "-y", "-o", str(trace), "-e", "trace=read,readv,pread64,preadv,lseek",
                           str(BIN / "dlio_ckpt"), *args], cwd=workdir / "cwd", env=cli_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = load_summary(run)
    reads = nbytes = seeks = 0
    lines = [line for part in workdir.glob("run.strace.*") for line in part.read_text().splitlines()]  # one per process
    for line in lines:
        match = re.search(r"(read|readv|pread64|preadv|lseek)\(\d+<([^>]*)>.*\) += (-?\d+)", line)
        if not match or "/train/" not in match.group(2) or not match.group(2).endswith(".npz"):
            continue
        if match.group(1) == "lseek":
            seeks += 1
        else:
            reads += 1
            nbytes += int(match.group(3))
    train = summary["train"]
    assert (train["reads"], train["bytes_read"]) == (reads, nbytes)
    with np.load(run / "events" / "rank-00000.npz") as data:
        events, phases = data["events"], list(__import__("json").loads(str(data["meta"]))["phases"])
    train_events = events[events["phase"] == phases.index("train")]
    assert op_count(train_events, "seek") == seeks > 0
    assert train["loader"]["workers"] == "processes" and train["loader"]["worker_starts"] == 4


def refused(overrides, expected):
    from dlio_ckpt.config.load import validate_command_line
    from dlio_ckpt.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        validate_command_line(overrides, multirun=False, world_size=1)
    message = str(error.value)
    assert expected in message and "\n" not in message


def test_worker_processes_where_the_platform_cannot_fork_are_refused(tmp_path, monkeypatch):
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    root = tmp_path / "store"
    refused(["workload=unet3d", "scale=tiny", "reader.read_threads=2", f"storage.root={root}"],
            "reader.workers: processes forks worker processes, which this platform cannot do")
    assert not root.exists()
    # threads, or no workers at all, need no fork
    from dlio_ckpt.config.load import validate_command_line

    validate_command_line(["workload=unet3d", "scale=tiny", "reader.workers=threads", f"storage.root={root}"],
                          multirun=False, world_size=1)


def test_a_decode_without_its_format_is_refused_in_one_line_with_exit_2(workdir):
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "reader.decode=pillow",
                    f"storage.root={workdir / 'store'}"], workdir / "cwd")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "reader.decode: pillow decodes jpeg/png samples" in lines[0], lines
    assert list((workdir / "cwd").iterdir()) == [] and not (workdir / "store").exists()


def test_a_worker_under_darshan_runtime_writes_its_own_log_beside_its_parents():
    # measured with the real non-MPI darshan-runtime 3.4.7: the main log and one per worker held 608 reads,
    # 63,623,962 bytes of a unet3d tiny run, exactly its summary.json; inheriting the parent's path,
    # the workers' logs could not be created ("unable to create log file") and their reads were lost
    from dlio_ckpt.engine.workers import own_darshan_log

    environ = {"DARSHAN_LOGFILE": "/run/darshan/job-rank0-pid10.darshan"}
    own_darshan_log(environ, 42)
    assert environ == {"DARSHAN_LOGFILE": "/run/darshan/job-rank0-pid10-worker-pid42.darshan"}
    untouched = {"LD_PRELOAD": "x"}
    own_darshan_log(untouched, 42)
    assert untouched == {"LD_PRELOAD": "x"}


def test_decode_torch_collates_what_numpy_decode_does(dataset):
    """decode=torch pays torch's own conversion and torch.cat; the batch holds the same floats."""
    pytest.importorskip("torch")
    from dlio_ckpt.engine.batch_fetch import BatchFetcher, OpenFiles

    rows = whole_plan(dataset).batch(0)
    batches = {}
    for decode in ("numpy", "torch"):
        fetcher = BatchFetcher(dataset, OpenFiles(traced()[0], get_format("npz"), FormatOptions(), 2), decode)
        buffer = bytearray(len(rows) * SAMPLE_BYTES * 4)
        assert fetcher.fill(rows, lambda nbytes: memoryview(buffer)[:nbytes]) == (len(rows), len(rows) * SAMPLE_BYTES)
        fetcher.close()
        batches[decode] = np.frombuffer(buffer, dtype=np.float32)
        assert fetcher.times.decode_s > 0 and fetcher.times.collate_s > 0
    assert np.allclose(batches["numpy"], batches["torch"]) and 0 < batches["torch"].max() <= 1


def test_decode_torch_without_torch_is_refused(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    refused(["workload=unet3d", "scale=tiny", "reader.decode=torch", f"storage.root={tmp_path / 'store'}"],
            "reader.decode: torch decodes and collates each sample with torch, which is not installed")
    assert not (tmp_path / "store").exists()


def test_workers_of_a_killed_rank_exit_on_their_own(dataset, tmp_path):
    """torch's worker watchdog: a rank SIGKILLed (a fault test, an OOM kill) leaves workers that
    would hold its launcher's output open forever (an MPI job that never ended)."""
    import signal
    import time

    script = tmp_path / "rank.py"
    script.write_text(
        "import os, sys, numpy as np\n"
        "from dlio_ckpt.engine.workers import ProcessReader\n"
        "from dlio_ckpt.formats import FileSpec, FormatOptions, get_format\n"
        "from dlio_ckpt.plan.read import EpochReadPlan\n"
        "from dlio_ckpt.plan.read_order import ListedOrder\n"
        "from dlio_ckpt.storage.posix import PosixStorage\n"
        f"specs = tuple(FileSpec(i, p, {SAMPLES}, {SAMPLE_BYTES}) for i, p in enumerate(sys.argv[1:]))\n"
        "reader = ProcessReader(PosixStorage(), get_format('npz'), FormatOptions(), specs, 2, 2, True, 'none')\n"
        "plan = EpochReadPlan(1, 0, ListedOrder(np.array([(0, 0)] * 8)), 1, False)\n"
        "batches = reader.batches(plan)\n"
        "next(batches)\n"
        "print(' '.join(str(p.pid) for p in __import__('multiprocessing').active_children()), flush=True)\n"
        "os.kill(os.getpid(), 9)\n")
    done = subprocess.run([sys.executable, str(script), *(s.path for s in dataset)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGKILL
    workers = [int(pid) for pid in done.stdout.split()]
    assert len(workers) == 2
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in workers):
        time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]
                   for pid in workers)
