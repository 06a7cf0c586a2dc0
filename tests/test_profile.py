"""dlio_ckpt-profile: Darshan logs of a real program -> a workload, and the workload run beside the log.

The reference program pytorch_cnn.py (benchmarks/realapps/) runs at its tiny size under the real
darshan-runtime (non-MPI build, one log per process, DXT on) once per test session; its profile is
checked value by value against what the program did (its arguments, its files, its own metrics),
and the profiled workload is run (--check) and compared against the log. ddp_dcp.py and
keras_tfdata.py (30-60 s each here) run with DLIO_CKPT_TEST_REALAPPS=all. The production job in
../shared/data/darshan/ (24 logs, POSIX counters only) and the bad-input cases need no runtime.
Skips, with the reason, without darshan-runtime, PyDarshan, torch or TensorFlow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlio_ckpt.profile.infer_checkpoint import Save, _numbering, _saves
from dlio_ckpt.profile.infer_sync import gradient_sync_value
from dlio_ckpt.profile.infer_timing import _solve, compute_per_step
from dlio_ckpt.profile.records import FileUse

REPO = Path(__file__).resolve().parents[1]
REALAPPS = REPO / "benchmarks" / "realapps"
SHARED = REPO.parent / "shared"  # ../shared beside the repository
RUNTIME = SHARED / "tools" / "darshan-runtime-3.4.7" / "nonmpi" / "libdarshan.so"
DLIO_LOGS = SHARED / "data" / "darshan" / "dlio_logs"
PROFILE = Path(sys.executable).parent / "dlio_ckpt-profile"
SLOW_SWITCH = "DLIO_CKPT_TEST_REALAPPS"
SLOW = {"ddp_dcp", "keras_tfdata"}

# Targets of issue 22, emulated / log.
BYTES_TOLERANCE = 0.02
CALLS_TOLERANCE = 0.15
# compute per step is inferred from timings; it is checked against the program's own figures of the
# same run, bracketed (_compute_ok): above, the 10 % target over the program's compute plus the waits
# its loader's hand-overs cost under load and its loader's end each epoch (no log dates either);
# below, a quarter of it: under load the inference falls short of the program's own compute (0.83x
# at load ~10, 0.57x once in a full run at load 6-9, pytorch_cnn; 0.995-1.02x on a quiet machine,
# docs/profile.md), for a reason not found yet, so the test guards against a profile that loses the
# compute (none, or a fraction of it) and the 10 % target is measured quiet, not asserted here
# (benchmarks/realapps/profile_accuracy.py)
COMPUTE_TOLERANCE = 0.10
COMPUTE_LOW = 0.75
# Where the emulation differs today for reasons outside the profiler, measured at this commit (tiny
# sizes; the accepted range holds the target too, so a fix passes at once).
# keras_tfdata's compute met it once its first step's tracing (0.7-2.5 s, then ~6 ms a step) became
# train.first_step_time and the run 4x its tiny file count (as pytorch_cnn): the first save's setup
# before its first write (57 ms against 11 ms later, the program's own clock), which the log
# counts in the epoch, was more than a tiny epoch's compute. The npz reads (np.load's buffered pattern, reader.npz_reads=np_load) and tf.data's read calls
# now meet the targets (2026-12-01: npz bytes and reads 1.000x, TFRecord reads 16 / 16), so they
# have no entry here.
NOT_YET: dict[tuple[str, str], tuple[float, float]] = {}
# keras_tfdata's compute per step had an entry here, (0.9, 2.0), until stop 34: in a third to a half
# of the runs it was 1.1-1.8x the program's compute, each time with an epoch's last next() on the
# tf.data iterator (the one that raises StopIteration) at 0.08-0.16 s, or ~0.5 s after the first
# epoch, where the others take ~1 ms: tf.data's autotuner stopping with the iterator
# (benchmarks/realapps/tfdata_teardown.py, profile_accuracy.py). Nothing is read then, so the log
# cannot tell it from the loop's compute; the program's clock now times that call (last_waits_s) and
# _compute_ok's upper end holds it, as it holds the loader's hand-overs.
# keras_tfdata's checkpoint bytes per save are exact now (but for the times its state file records):
# the flat directory and save-counter names of CheckpointManager, and TF's write order in the index
# (model.write_order); they were +31 to +57 B a save (0.99997x-1.00004x) before.
# keras_tfdata's checkpoint writes meet the 15 % now (34 / 34: the engine records TensorFlow's
# fwrite calls one by one, checkpoint/tf_bundle_writes.py; it recorded 10, one per file, before)


def _sizes() -> dict:
    """pytorch_cnn at 4x its tiny file count (16 steps per epoch, ~2 s more): when the first batch of
    an epoch reaches the loop (20-50 ms after its reads end) is estimated, not seen, and an error of
    30 ms is 5-10 % of a 4-step epoch's compute on this machine, a quarter of that at 16 steps.
    ddp_dcp likewise (8 steps per rank per epoch, where 2 cannot show whether its ranks step together:
    train.gradient_sync). keras_tfdata likewise (32 steps per epoch): its first save's setup before its first write is in
    the epoch the log sees, ~50 ms, most of a tiny epoch's 8 steps of ~6 ms."""
    sys.path.insert(0, str(REALAPPS))
    from programs import Size

    return {"pytorch_cnn": Size(64, 1, 4, 2), "ddp_dcp": Size(64, 1, 4, 2), "keras_tfdata": Size(16, 8, 4, 2)}


SIZES = _sizes()
from loop_clock import undated_loop_s  # noqa: E402  (REALAPPS on sys.path: _sizes)
from programs import traced_environment  # noqa: E402


needs_dlio_logs = pytest.mark.skipif(not DLIO_LOGS.is_dir(), reason="../shared/data/darshan/dlio_logs not present")


def _skip_reason(name: str, needs: str) -> str | None:
    if name in SLOW and os.environ.get(SLOW_SWITCH) != "all":
        return f"{name}: its run under darshan-runtime takes 30-60 s here; set {SLOW_SWITCH}=all to run it"
    if not RUNTIME.is_file():
        return f"darshan-runtime not present at {RUNTIME}"
    for module in ("darshan", needs):
        try:
            __import__(module)
        except ImportError:
            return f"{module} is not installed"
    return None


@pytest.fixture(scope="session")
def traced(tmp_path_factory):
    """Each reference program run once, tiny, under the real darshan-runtime: its logs, its metrics."""
    sys.path.insert(0, str(REALAPPS))
    from programs import PROGRAMS

    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        program = PROGRAMS[name]
        reason = _skip_reason(name, program.needs)
        if reason:
            pytest.skip(reason)
        if name not in cache:
            work = tmp_path_factory.mktemp(name)
            size = SIZES.get(name, program.sizes["tiny"])
            storage, logs = work / "storage", work / "logs"
            logs.mkdir()
            subprocess.run(program.generate_command(storage, work / "generate", size), check=True, capture_output=True,
                           timeout=240)
            env = traced_environment(RUNTIME, logs)
            metrics = work / "metrics.json"
            cmd = program.real_command(storage / "data" / name, storage / "real_checkpoints", size, metrics)
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            cache[name] = {"logs": logs, "metrics": json.loads(metrics.read_text()), "size": size, "work": work,
                           "storage": storage, "program": program}
        return cache[name]

    return get


def _profile(run: dict, batch: bool = True):
    from dlio_ckpt.profile.profile import profile_logs

    return profile_logs(sorted(run["logs"].glob("*.darshan")), batch_size=run["size"].batch_size if batch else None)


def _ratio_ok(program: str, name: str, log: float, emulated: float, tolerance: float) -> None:
    lo, hi = NOT_YET.get((program, name), (1 - tolerance, 1 + tolerance))
    assert log > 0, f"{program}: the log has no {name}: the check would mean nothing"
    assert lo <= emulated / log <= hi, f"{program} {name}: emulated {emulated:,} / log {log:,} = {emulated / log:.4f}"


def _own_bytes(program: str, run: dict, kept: Path, saves: int) -> int:
    """What the saves record of their own location and time, over the run, emulated less real: the
    run's, not the program's, so the rest must be equal byte for byte.

    - DCP's .metadata pickles the checkpoint's folder (StorageMeta.checkpoint_id, a Path), and the
      two runs keep their saves in folders of other names (real_checkpoints/epoch_1, checkpoints/
      <run>/step_00000002): each save differs by the two paths' pickles, read back from a .metadata.
    - CheckpointManager's `checkpoint` state lists, at each of its two writes a save, the time
      every tracked checkpoint was written and the manager's start, as Python's repr of each float:
      17 or 18 characters, as the clock falls. Both runs keep every save (max_to_keep 3, keep_last 0),
      so each run's final state file holds every time it wrote: save k's writes list saves 1..k.
    (torch.save's zip records its file's name too: the profile chooses the flat layout, whose files
    have the program's names, checkpoint_<n>.pt, so that one is equal.)"""
    if program == "ddp_dcp":
        import pickle

        from torch.distributed.checkpoint import FileSystemReader

        def recorded(folder: Path):
            return FileSystemReader(str(folder)).read_metadata().storage_meta.checkpoint_id

        (emulated, *_) = sorted(kept.glob("dlio_ckpt-profile-check-*/storage/checkpoints/**/.metadata"))
        real = recorded(run["storage"] / "real_checkpoints" / "epoch_1")
        return saves * (len(pickle.dumps(Path(recorded(emulated.parent)))) - len(pickle.dumps(Path(real))))
    if program == "keras_tfdata":
        import re

        def times(state: Path) -> int:
            text = state.read_text()
            kept_times = [len(t) for t in re.findall(r"^all_model_checkpoint_timestamps: (\S+)$", text, re.M)]
            (preserved,) = [len(t) for t in re.findall(r"^last_preserved_timestamp: (\S+)$", text, re.M)]
            assert len(kept_times) == saves, text  # every save still tracked
            return sum(2 * (sum(kept_times[:k]) + preserved) for k in range(1, saves + 1))

        (emulated,) = kept.glob("dlio_ckpt-profile-check-*/storage/checkpoints/*/checkpoint")
        return times(emulated) - times(run["storage"] / "real_checkpoints" / "checkpoint")
    return 0


def _compute_ok(program: str, metrics: dict, inferred: float) -> None:
    """The log shows when a batch's reads ended, not when the loader handed the batch over: the
    rest (the worker's decode and collate, its hand-over) the program counts as waiting in next(),
    the profile as compute where it overlaps the loop, and it grows with the machine's load. So the
    inferred compute per step is bracketed by what the program measured in the same run, not by
    one figure: at least its compute, at most its compute plus its waits for batches after the
    first of each epoch (the workers' start, before the loop the profile spans) and its epochs' last
    next() calls (the loader's end: a DataLoader stopping its workers, tf.data its threads and
    autotuner, 0.1-0.5 s in a third to a half of keras_tfdata's runs, when nothing is read),
    within COMPUTE_LOW and COMPUTE_TOLERANCE. It fails when the profile loses compute or invents time the program did
    not spend."""
    steps = max(1, metrics["steps"])
    compute = metrics["compute_s_per_step"]
    waits = undated_loop_s(metrics) / steps
    lo, hi = NOT_YET.get((program, "compute"), (1 - COMPUTE_LOW, 1 + COMPUTE_TOLERANCE))
    assert compute > 0, f"{program}: the program timed no compute: the check would mean nothing"
    assert lo * compute <= inferred <= hi * (compute + waits), (
        f"{program} compute per step: inferred {inferred:.4f} s, the program's {compute:.4f} s "
        f"(+ {waits:.4f} s of waits for batches and for the loader's ends)")


@pytest.mark.parametrize("name", ["pytorch_cnn", "ddp_dcp", "keras_tfdata"])
def test_profiled_workload_reproduces_the_program(traced, tmp_path, name):
    run = traced(name)
    size = run["size"]
    out = tmp_path / f"{name}.yaml"
    from dlio_ckpt.profile.cli import main

    main([str(run["logs"]), "-o", str(out), "--batch-size", str(size.batch_size)])
    from omegaconf import OmegaConf

    workload = OmegaConf.load(out)
    program = run["program"]
    # what the program was given and read, found in the logs
    assert workload.dataset.num_files_train == size.files
    assert workload.dataset.format == program.dataset_format
    assert workload.dataset.num_samples_per_file == size.samples_per_file
    assert workload.dataset.record_length_bytes == 3072  # --side 32: 3 x 32 x 32 uint8
    assert workload.train.epochs == size.epochs
    assert workload.checkpoint.enabled is True
    text = out.read_text()
    for value in ("# measured:", "# inferred:", "# given: --batch-size", "Not inferred"):
        assert value in text
    # the compute per step the log implies, against the program's own timing of its loop in the same run
    steps = run["metrics"]["steps"]  # the program's own count: its first step once, the rest at computation_time
    _compute_ok(name, run["metrics"], workload.train.computation_time + workload.train.first_step_time / steps)
    # a tf.data program's epochs end in its iterator's teardown, which no log dates: its comment says so
    (comment,) = [line for line in text.splitlines() if line.strip().startswith("computation_time:")]
    assert ("with tf.data, an epoch's end" in comment) == (name == "keras_tfdata"), comment
    assert ("each step's next() on a batch tf.data has ready" in comment) == (name == "keras_tfdata"), comment
    # a TensorFlow save's walk of its object graph comes before its first write: measured on the
    # checkpoint the program left, and out of the compute per step (the others' are assumed 0)
    framework = [line for line in text.splitlines() if line.strip().startswith("framework_cpu_s:")]
    if name == "keras_tfdata":
        assert workload.checkpoint.framework_cpu_s > 0 and "# measured: on disk: saves of a stand-in" in framework[0]
        assert workload.checkpoint.framework_first_cpu_s >= 0
    else:
        assert workload.checkpoint.framework_cpu_s == 0 and "# assumed:" in framework[0]
    # DDP's ranks meet at every step's all-reduce; the others run one rank
    assert workload.train.gradient_sync == ("barrier" if name == "ddp_dcp" else "none")
    if name == "pytorch_cnn":
        assert workload.reader.read_threads == 2  # --workers 2
        # torch.save(state, "<folder>/checkpoint_<epoch>.pt"): every save in one folder, none made per save
        assert workload.checkpoint.format == "torch" and workload.checkpoint.layout == "flat"
    # the workload, run at the log's rank count, beside the log
    from dlio_ckpt.profile.check import run_check

    profile = _profile(run)
    rows = {row.name: row for row in run_check(profile, out, keep=tmp_path)}
    saves = rows["checkpoints (saves)"]
    assert saves.log == saves.emulated == size.epochs
    per_save = rows["checkpoint bytes per save"]
    if name == "pytorch_cnn":  # the log's figure is the file torch.save wrote
        assert per_save.log == (run["storage"] / "real_checkpoints" / "checkpoint_1.pt").stat().st_size
    # exactly: the containers are the program's byte for byte, but for where and when the emulated run wrote them
    written = rows["checkpoint bytes_written"]
    assert per_save.log == written.log // saves.log  # the log's checkpoint bytes over its saves, as the emulated
    _ratio_ok(name, "checkpoint bytes per save", (written.log + _own_bytes(name, run, tmp_path, saves.log)) // saves.log,
              per_save.emulated, 0.0)
    _ratio_ok(name, "checkpoint bytes_written", rows["checkpoint bytes_written"].log, rows["checkpoint bytes_written"].emulated, BYTES_TOLERANCE)
    _ratio_ok(name, "checkpoint writes", rows["checkpoint writes"].log, rows["checkpoint writes"].emulated, CALLS_TOLERANCE)
    if name != "pytorch_cnn":  # darshan-runtime counts 47 POSIX opens of one torch.save file (as many as its
        # writevs, on a descriptor fopen() gave: its POSIX module never saw the open) beside 1 STDIO fopen;
        # strace sees 1 open a save on both sides (test_realapps_fidelity)
        _ratio_ok(name, "checkpoint opens", rows["checkpoint opens"].log, rows["checkpoint opens"].emulated,
                  CALLS_TOLERANCE)
    else:  # those artefacts of darshan-runtime 3.4.7, pinned, so that a change on either side shows: an open
        # counted for each writev and one more a save (48 a save), against the emulation's one a save; and
        # reads of the DataLoader's messages on the file's reused descriptor, against none
        assert rows["checkpoint opens"].log == rows["checkpoint writes"].log + saves.log
        assert rows["checkpoint opens"].emulated == saves.emulated
        assert rows["checkpoint reads"].log > 0 and rows["checkpoint reads"].emulated == 0
    assert not profile.job.partial, [log.name for log, _ in profile.job.partial]
    _ratio_ok(name, "dataset bytes_read", rows["dataset bytes_read"].log, rows["dataset bytes_read"].emulated, BYTES_TOLERANCE)
    _ratio_ok(name, "dataset reads", rows["dataset reads"].log, rows["dataset reads"].emulated, CALLS_TOLERANCE)
    _ratio_ok(name, "dataset opens", rows["dataset opens"].log, rows["dataset opens"].emulated, CALLS_TOLERANCE)
    assert rows["checkpoint fsyncs"].log == rows["checkpoint fsyncs"].emulated
    # what the framework reads back of its own checkpoint, exactly: none for DCP; TensorFlow's
    # MergeV2Checkpoints reads each staged index (3 preads a save for a one-block index, 2,118 B).
    # Not torch.save's: darshan-runtime never sees its file closed (fopen, then writev on the
    # descriptor) and gives the file the reads of whatever reuses the descriptor next (the
    # DataLoader's 4 + 434-byte messages, past the file's end: 32 in pytorch_cnn's log); strace
    # counts none on either side (test_realapps_fidelity)
    if name != "pytorch_cnn":
        reads = 3 * size.epochs if name == "keras_tfdata" else 0
        assert rows["checkpoint reads"].log == rows["checkpoint reads"].emulated == reads
        assert rows["checkpoint bytes_read"].log == rows["checkpoint bytes_read"].emulated == (2118 * size.epochs if reads else 0)
    if name != "keras_tfdata":
        assert rows["checkpoint renames"].log == rows["checkpoint renames"].emulated
    else:  # darshan-runtime 3.4.7 sees none of TensorFlow's renames; the emulation makes TF's 3 a save
        # (MergeV2Checkpoints' data file, the `checkpoint` state twice): strace sees 6 in the program's 2 saves
        assert (rows["checkpoint renames"].log, rows["checkpoint renames"].emulated) == (0, 3 * saves.emulated)


@needs_dlio_logs
def test_production_job_profiles_and_names_what_it_cannot_infer(tmp_path):
    darshan = pytest.importorskip("darshan")
    out = tmp_path / "dlio.yaml"
    done = subprocess.run([str(PROFILE), str(DLIO_LOGS), "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    from omegaconf import OmegaConf

    workload = OmegaConf.load(out)
    # an independent count with PyDarshan: the files read under the dataset folder, the bytes written
    # under the checkpoint folder, the opens per file
    files, written, opens = set(), 0, {}
    for log in sorted(DLIO_LOGS.glob("*.darshan")):
        report = darshan.DarshanReport(str(log), read_all=True)
        names = dict(report.name_records)
        for row in report.records["POSIX"].to_df()["counters"].to_dict("records"):
            path = names[row["id"]]
            if path.endswith(".npz") and row["POSIX_BYTES_READ"] > 0:
                files.add(path)
                opens[path] = opens.get(path, 0) + int(row["POSIX_OPENS"])
            if "/checkpoints/" in path:
                written += int(row["POSIX_BYTES_WRITTEN"])
    assert workload.dataset.num_files_train == len(files) == 168
    assert workload.dataset.format == "npz"
    assert workload.train.epochs == sorted(opens.values())[len(opens) // 2]
    assert workload.reader.read_threads == 4  # 16 spawned DataLoader workers over 4 ranks
    assert workload.model.model_size_bytes == written  # one save of two files by one rank
    assert workload.checkpoint.strategy == "single_writer"
    text = out.read_text()
    header = text.split("workload:")[0]
    for key in ("train.computation_time", "reader.batch_size", "dataset.num_samples_per_file"):
        assert f"#   {key} = " in header  # named as not inferred
    assert "POSIX counters" in header and "no DXT" in header
    assert "not inferred" in done.stderr and "train.computation_time" in done.stderr
    # and dlio_ckpt takes it as a workload at the job's 4 ranks
    from dlio_ckpt.config.load import validate_command_line
    from dlio_ckpt.config.workload_files import resolve

    overrides, _ = resolve([f"workload={out}", "mode=plan"])
    validate_command_line(overrides, multirun=False, world_size=4, free_space=False)


def _bad(args: list[str], expected: str, tmp_path: Path) -> None:
    out = tmp_path / "never.yaml"
    done = subprocess.run([str(PROFILE), *args, "-o", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert not out.exists() and not list(tmp_path.glob(".never.yaml*"))


@needs_dlio_logs
def test_truncated_log_is_one_line_naming_it(tmp_path):
    pytest.importorskip("darshan")
    log = sorted(DLIO_LOGS.glob("*.darshan"))[0]
    cut = tmp_path / "cut.darshan"
    data = log.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    _bad([str(cut)], f"{cut}:", tmp_path)


@needs_dlio_logs
def test_logs_of_two_jobs_are_refused(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_bad_input import dxt_log

    other = dxt_log(tmp_path)
    _bad([str(DLIO_LOGS), str(other)], "give the logs of one run only", tmp_path)


@needs_dlio_logs
def test_log_without_a_dataset_is_refused(tmp_path):
    pytest.importorskip("darshan")
    helper = next(p for p in sorted(DLIO_LOGS.glob("*2110482*.darshan")))  # multiprocessing's resource tracker
    _bad([str(helper)], "no recognisable dataset", tmp_path)


def test_missing_and_empty_inputs_are_refused(tmp_path):
    _bad([str(tmp_path / "absent.darshan")], "no such file or folder", tmp_path)
    (tmp_path / "empty").mkdir()
    _bad([str(tmp_path / "empty")], "a folder without .darshan logs", tmp_path)


def test_compute_per_step_is_the_loop_that_ends_at_the_save():
    """Three epochs of 8 files read back to back, 2 per step (4 steps), every batch ready before the
    loop wants it: the loop starts at the first batch (0.02 s) and computes 0.25 s per step up to
    the save."""
    reads = []
    for epoch in range(3):
        t0 = 10.0 * epoch
        reads += [(t0 + 0.01 * i, t0 + 0.01 * (i + 1), 0) for i in range(8)]
    saves = [10.0 * e + 0.02 + 4 * 0.25 for e in range(3)]
    found = compute_per_step(reads, files=8, epochs=3, files_per_batch=2, ranks=1, save_starts=saves, exits={})
    assert found.per_epoch == pytest.approx([0.25, 0.25, 0.25], abs=1e-9)
    assert found.steady == pytest.approx(0.25, abs=1e-9)
    assert found.first_step == pytest.approx(0.0, abs=1e-9)


def test_a_ready_batchs_next_is_left_out_of_the_compute():
    """tf.data's next() on a batch it has ready costs the loop a little every step, which the
    program counts as waiting and the log cannot show: given that cost, each of the 4 steps' span
    after the first holds it once, so the same loop computes 3 x 0.01 s less over its 4 steps."""
    reads = [(0.01 * i, 0.01 * (i + 1), 0) for i in range(8)]
    found = compute_per_step(reads, files=8, epochs=1, files_per_batch=2, ranks=1, save_starts=[0.02 + 4 * 0.25],
                             exits={}, ready_next_s=0.01)
    assert found.per_epoch == pytest.approx([0.25 - 3 * 0.01 / 4], abs=1e-9)


def test_the_ready_batch_stand_in_times_a_next_call():
    """The stand-in (dlio_ckpt/profile/tf_data_next.py) runs tf.data and gives one call's seconds;
    its records are the profiled ones but for a 140 MB one, which would make its 32 batches of 4
    18 GB: cut to 1 MiB a batch."""
    pytest.importorskip("tensorflow")
    from dlio_ckpt.profile.tf_data_next import BATCH_BYTES_CAP, ready_batch_next_s, stand_in_record_bytes

    assert stand_in_record_bytes(3072, 4) == 3072
    assert stand_in_record_bytes(140_000_000, 4) == BATCH_BYTES_CAP // 4 == 262_144
    assert stand_in_record_bytes(0, 0) == 1
    call = ready_batch_next_s(140_000_000, batch=4)
    assert isinstance(call, float) and call > 0


def test_a_saves_work_before_its_first_write_is_left_out_of_the_compute():
    """The log dates a save by its first write; a TensorFlow save walks its object graph before it
    (checkpoint.framework_cpu_s, and framework_first_cpu_s more in the first save). As above, each
    save's first write 0.04 s after the loop ended, the first's 0.04 + 0.12 s: with those setups the
    loop computes 0.25 s a step in every epoch, the first step traces nothing; without them each
    epoch's 4 steps take its save's setup too."""
    reads = []
    for epoch in range(3):
        t0 = 10.0 * epoch
        reads += [(t0 + 0.01 * i, t0 + 0.01 * (i + 1), 0) for i in range(8)]
    saves = [10.0 * e + 0.02 + 4 * 0.25 + 0.04 + (0.12 if e == 0 else 0.0) for e in range(3)]
    found = compute_per_step(reads, files=8, epochs=3, files_per_batch=2, ranks=1, save_starts=saves, exits={},
                             save_setup_s=(0.04, 0.12))
    assert found.per_epoch == pytest.approx([0.25, 0.25, 0.25], abs=1e-9)
    assert found.first_step == pytest.approx(0.0, abs=1e-9)
    counted = compute_per_step(reads, files=8, epochs=3, files_per_batch=2, ranks=1, save_starts=saves, exits={})
    assert counted.per_epoch == pytest.approx([0.25 + 0.16 / 4, 0.26, 0.26], abs=1e-9)
    # a setup longer than the time since the epoch's last read ends the loop at that read, not before
    early = compute_per_step(reads, files=8, epochs=3, files_per_batch=2, ranks=1, save_starts=saves, exits={},
                             save_setup_s=(5.0, 0.0))
    assert early.per_epoch == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_a_first_step_that_traces_is_paid_once_not_every_step():
    """As above, but the first epoch's loop reaches its save 2 s later (a tf.function traced in its
    first step): compute per step stays 0.25 (the later epochs'), the first step's 2 s are set
    apart, and over the run's 12 steps the compute is the same as the log's."""
    reads = []
    for epoch in range(3):
        t0 = 10.0 * epoch
        reads += [(t0 + 0.01 * i, t0 + 0.01 * (i + 1), 0) for i in range(8)]
    saves = [10.0 * e + 0.02 + 4 * 0.25 + (2.0 if e == 0 else 0.0) for e in range(3)]
    found = compute_per_step(reads, files=8, epochs=3, files_per_batch=2, ranks=1, save_starts=saves, exits={})
    assert found.per_epoch == pytest.approx([0.75, 0.25, 0.25], abs=1e-9)
    assert found.steady == pytest.approx(0.25, abs=1e-9)
    assert found.first_step == pytest.approx(2.0, abs=1e-9)
    assert found.mean(12) * 12 == pytest.approx(3 * 4 * 0.25 + 2.0, abs=1e-9)
    # one epoch alone cannot tell its first step from the rest: all of it is compute per step
    alone = compute_per_step(reads[:8], files=8, epochs=1, files_per_batch=2, ranks=1, save_starts=saves[:1], exits={})
    assert alone.steady == pytest.approx(0.75, abs=1e-9) and alone.first_step == 0.0
    # a first epoch quicker than the later ones (a loaded machine's later epochs) traced nothing: all count
    slow_later = [s + (0.4 if k else 0.0) for k, s in enumerate(saves[:2])]
    two = compute_per_step(reads[:16], files=8, epochs=2, files_per_batch=2, ranks=1, save_starts=slow_later, exits={})
    assert two.per_epoch == pytest.approx([0.75, 0.35], abs=1e-9)
    assert two.first_step == pytest.approx(0.4 * 4, abs=1e-9) and two.steady == pytest.approx(0.35, abs=1e-9)
    quick_first = [s + (2.0 if k else -2.0) for k, s in enumerate(slow_later)]
    two = compute_per_step(reads[:16], files=8, epochs=2, files_per_batch=2, ranks=1, save_starts=quick_first, exits={})
    assert two.per_epoch == pytest.approx([0.25, 0.85], abs=1e-9)
    assert two.first_step == 0.0 and two.steady == pytest.approx(0.55, abs=1e-9)


def test_a_batch_reaches_the_loop_a_hand_over_after_its_reads():
    """Two workers, each reading its batch of 2 files and pausing 0.015 s (collate and send) before
    its next batch: the loop gets each batch twice that, 0.03 s, after its reads end (the worker's
    send and the loop's receive), and spends the receiving 0.015 s on every later step too; the
    epoch ends when the workers quit (before the save)."""
    reads = [(0.00, 0.01, 1), (0.01, 0.02, 1), (0.035, 0.06, 1), (0.06, 0.07, 1),
             (0.00, 0.01, 2), (0.01, 0.02, 2), (0.035, 0.06, 2), (0.06, 0.07, 2)]
    # first batch at 0.02 + 0.03 = 0.05; then 3 x (0.2 + 0.015) and the last step's 0.2: 0.895
    found = compute_per_step(reads, files=8, epochs=1, files_per_batch=2, ranks=1, save_starts=[2.0],
                             exits={1: 0.895, 2: 0.9})
    assert found.steady == pytest.approx(0.2, abs=1e-9)


def test_compute_per_step_leaves_out_the_waits_for_data():
    # batches ready at 0, 1, 2 (slow storage), the loop computes 0.1 s: it ends at 2.1 (a loop that
    # waited for nothing would have ended at 0.3)
    assert _solve([0.0, 1.0, 2.0], 2.1) == pytest.approx(0.1, abs=1e-9)
    # and a loop that never waits: 3 steps of 0.5 s
    assert _solve([0.0, 0.0, 0.0], 1.5) == pytest.approx(0.5, abs=1e-9)


def _use(path: str, opened: float, closed: float, written: int) -> tuple[FileUse, int, int]:
    f = FileUse(path, ("POSIX",), opens=1, writes=1 if written else 0, bytes_written=written,
                first_open=opened, last_close=closed)
    return f, 0, written


def test_saves_are_told_apart_by_the_reads_between_them():
    # DLIO's two files of one save, back to back; then a torch.save per epoch with reads between
    one = _saves([_use("/c/model-5.pt", 100.0, 100.6, 10), _use("/c/layer-0-5.pt", 100.6, 100.7, 2)], [])
    assert [len(s.files) for s in one] == [2] and one[0].bytes == 12
    two = _saves([_use("/c/checkpoint_1.pt", 5.0, 5.03, 7), _use("/c/checkpoint_2.pt", 5.2, 5.23, 7)], [5.1])
    assert [s.bytes for s in two] == [7, 7]


def test_checkpoint_numbers_in_the_names_tell_a_save_counter_from_the_step():
    """CheckpointManager.save() names ckpt-1, ckpt-2; save(checkpoint_number=step) ckpt-32, ckpt-64
    (checkpoint.flat_numbers: counter or step); a name with no number leaves the key at its default."""
    def saves(*names):
        return [Save(float(k), [(name, 0, 10)]) for k, name in enumerate(names)]

    counter = _numbering(saves("/c/ckpt-1.index", "/c/ckpt-2.index"), "tensorflow")
    by_step = _numbering(saves("/c/ckpt-32.index", "/c/ckpt-64.index"), "tensorflow")
    flat = _numbering(saves("/c/checkpoint_5.pt", "/c/checkpoint_10.pt"), "flat")
    assert (counter.key, counter.value, by_step.value, flat.value) == ("checkpoint.flat_numbers", "counter", "step", "step")
    assert "32, 64" in by_step.why
    assert _numbering(saves("/c/model.pt", "/c/model.pt"), "flat") is None
    assert _numbering(saves("/c/ckpt-1.index", "/c/ckpt-2.index"), "raw") is None  # a folder per save: named by the step


def test_a_save_whose_files_are_far_apart_under_load_stays_one_save():
    """keras_tfdata's second save under load (darshan-runtime, 2026-12-02): its staged data file and
    index, then its merged index, then CheckpointManager's two `checkpoint` state writes 0.48 s and
    1.64 s later, with no dataset read in between (the run's last epoch had ended). The pause rule
    split it into 3 saves (4 in the run) while reads were there to go by; it is one save."""
    first = [_use("/c/ckpt-1_temp/part-00000-of-00001.data-00000-of-00001.tempstate1", 16.149, 16.157, 1550956),
             _use("/c/ckpt-1_temp/part-00000-of-00001.index.tempstate2", 16.158, 16.159, 2131),
             _use("/c/ckpt-1.index", 16.1697, 16.1707, 2131),
             _use("/c/checkpoint.tmp1", 16.1718, 16.1724, 166), _use("/c/checkpoint.tmp2", 16.1726, 16.1734, 166)]
    second = [_use("/c/ckpt-2_temp/part-00000-of-00001.data-00000-of-00001.tempstate3", 16.417, 16.425, 1550956),
              _use("/c/ckpt-2_temp/part-00000-of-00001.index.tempstate4", 16.4252, 16.4259, 2131),
              _use("/c/ckpt-2.index", 16.4269, 16.4274, 2131),
              _use("/c/checkpoint.tmp3", 16.9081, 16.9089, 255), _use("/c/checkpoint.tmp4", 18.0638, 18.0646, 255)]
    found = _saves(first + second, [8.85, 10.60, 16.206, 16.21])
    assert [len(s.files) for s in found] == [5, 5]
    assert [s.bytes for s in found] == [1555550, 1555728]


def test_an_empty_module_mapped_to_the_logs_end_is_not_damage(tmp_path):
    """darshan-runtime 3.4.7 maps a module that recorded nothing (a `uname -p` that TensorFlow starts:
    its STDIO, DXT_POSIX, HEATMAP) to the log's end with length 0; the check took that for damage and
    refused the whole run. Past the end it still is damage."""
    import struct

    sys.path.insert(0, str(Path(__file__).parent))
    from test_bad_input import dxt_log

    from dlio_ckpt.trace.darshan_check import DamagedLog, check_log

    data = bytearray(dxt_log(tmp_path).read_bytes())
    slot = 32 + 16 + 16 * 9  # the 3.41 header's map entry of module 9 (STDIO), empty in this log
    assert struct.unpack_from("<QQ", data, slot) == (0, 0)
    struct.pack_into("<QQ", data, slot, len(data), 0)
    assert check_log(bytes(data)).nprocs == 2
    struct.pack_into("<QQ", data, slot, len(data) + 1, 0)
    with pytest.raises(DamagedLog, match="past the log's end"):
        check_log(bytes(data))


@needs_dlio_logs
def test_strace_fills_the_checkpoint_bytes_a_partial_log_lacks(tmp_path):
    """A rank whose log ran out of POSIX records: torch.save's fopen is in STDIO (no bytes), the files
    are gone from disk; the run's strace output gives each file's bytes (writev and write lines)."""
    from dlio_ckpt.profile.classify import classify
    from dlio_ckpt.profile.infer_checkpoint import checkpoint_values
    from dlio_ckpt.profile.records import Job, Process
    from dlio_ckpt.profile.strace_input import written_bytes

    gone = tmp_path / "gone"
    data = [FileUse(f"{gone}/data/img_{i}.npz", ("POSIX",), opens=2, reads=12, bytes_read=7328, max_byte_read=3569,
                    first_open=1.0 + i) for i in range(4)]
    ckpts = [FileUse(f"{gone}/ckpt/checkpoint_{e}.pt", ("STDIO",), opens=1, first_open=10.0 * e, last_close=10.0 * e + 0.1)
             for e in (1, 2)]
    job = Job([Process(tmp_path / "a.darshan", 1, 0, "python train.py", 0.0, 30.0, data + ckpts)], 1, "POSIX counters", 1,
              [tmp_path / "a.darshan"])
    roles = classify(job)
    trace = tmp_path / "trace.1234"
    trace.write_text("\n".join([
        f'openat(AT_FDCWD</w>, "{gone}/ckpt/checkpoint_1.pt", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 5<{gone}/ckpt/checkpoint_1.pt>',
        f"writev(5<{gone}/ckpt/checkpoint_1.pt>, [...], 2) = 9000",
        f"write(5<{gone}/ckpt/checkpoint_1.pt>, \"\"..., 637) = 637",
        f"[pid  77] writev(6<{gone}/ckpt/checkpoint_2.pt>, [...], 2) = 9637",
        f"read(3<{gone}/data/img_0.npz>, \"\"..., 4096) = 3570",
    ]) + "\n")
    extra = written_bytes([trace])
    assert extra == {f"{gone}/ckpt/checkpoint_1.pt": 9637, f"{gone}/ckpt/checkpoint_2.pt": 9637}
    values, facts = checkpoint_values(job, roles, 2, "torch", extra, [5.0, 15.0])
    assert [s.bytes for s in facts.saves] == [9637, 9637] and facts.bytes_source == "strace"
    assert {v.key: v.value for v in values}["checkpoint.epochs_between_checkpoints"] == 1
    not_strace = tmp_path / "notes.txt"
    not_strace.write_text("hello\n")
    _bad([str(DLIO_LOGS), "--strace", str(not_strace)], "holds no strace lines", tmp_path)


def _lockstep_reads(intervals: list[list[float]], skew: list[list[float]], steps: int, epochs: int = 2,
                    prefetch: int = 2, per_batch: int = 4) -> list[tuple[float, float, int]]:
    """DataLoader-like reads of 2 ranks, one worker process each per epoch: the first `prefetch`
    batches read at the epoch's start, then batch k when rank r's loop took batch k - prefetch,
    intervals[r][k] after the previous one, shifted by skew[r][k]; 1 ms per file."""
    reads = []
    for e in range(epochs):
        for r in range(2):
            t = 100.0 * e
            for k in range(steps):
                if k >= prefetch:
                    t += intervals[r][k]
                at = t + skew[r][k] + (0.0 if k >= prefetch else 0.004 * k)
                reads += [(at + 0.001 * f, at + 0.001 * (f + 1), 2 * e + r + 1) for f in range(per_batch)]
    return sorted(reads)


def test_ranks_whose_batches_are_read_in_step_meet_at_every_step():
    """Two ranks whose loops take each batch at the same moment (their steps vary alike, 60-140 ms,
    as DDP's all-reduce makes them) and read within 2 ms of each other: barrier, strong (12 paced
    steps); the same ranks each varying on their own drift apart (~35 ms after a few steps, more
    than a quarter step) and do not meet: none."""
    import numpy as np

    rng = np.random.default_rng(7)
    steps = 14
    shared = list(0.1 + rng.uniform(-0.04, 0.04, steps))
    near = [list(rng.uniform(0, 0.002, steps)) for _ in range(2)]
    reads = _lockstep_reads([shared, shared], near, steps)
    met = gradient_sync_value(reads, files=2 * steps * 4, epochs=2, files_per_batch=4, ranks=2)
    assert met.value == "barrier" and "evidence strong" in met.why, met.why
    # the second rank's worker starting 90 ms later and reading its prefetch slowly (as under load:
    # its second batch 60 ms after its first, taken for the loop's pace): one gap of a step, the same
    late = [near[0], [t + {0: 0.09, 1: 0.15}.get(k, 0.0) for k, t in enumerate(near[1])]]
    met = gradient_sync_value(_lockstep_reads([shared, shared], late, steps), files=2 * steps * 4, epochs=2,
                              files_per_batch=4, ranks=2)
    assert met.value == "barrier", met.why
    import re

    most, step = (float(x) for x in re.search(r"at most ([\d.]+) ms\) over \d+ paced batches, steps of ([\d.]+) ms",
                                              met.why).groups())
    assert most > 0.25 * step  # an outlier beyond a quarter step, which three in four pairs are not
    # the second rank's worker woken 15 ms after its partner at every step (a loaded machine): a
    # steady lag, not a drift: the same
    woken = [near[0], [t + 0.015 for t in near[1]]]
    met = gradient_sync_value(_lockstep_reads([shared, shared], woken, steps), files=2 * steps * 4, epochs=2,
                              files_per_batch=4, ranks=2)
    assert met.value == "barrier" and "steady lag (median 1" in met.why, met.why
    own = [list(0.1 + rng.uniform(-0.04, 0.04, steps)) for _ in range(2)]
    apart = gradient_sync_value(_lockstep_reads(own, near, steps), files=2 * steps * 4, epochs=2, files_per_batch=4,
                                ranks=2)
    assert apart.value == "none" and "do not step together" in apart.why, apart.why
    # one rank has no one to meet; without DXT nothing can be seen (the default, named)
    one = gradient_sync_value(reads, files=2 * steps * 4, epochs=2, files_per_batch=4, ranks=1)
    assert one.value == "none" and one.how == "measured"
    unseen = gradient_sync_value([], files=2 * steps * 4, epochs=2, files_per_batch=4, ranks=2)
    assert unseen.value == "none" and unseen.how == "assumed"
