"""Damaged and hostile input to the side commands (dlio_ckpt-advise, dlio_ckpt-import-dlio) and the
storage layer's handles: one line, exit 2 (bad input) or 1 (run time), nothing written, no traceback.

Issue 24 found these by trying them; each test here failed before its fix.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from dlio_ckpt.advisor.cli import main as advise

# A run summary with just what the advisor reads (docs/advisor.md, step 1): three checkpoints of
# 1.8 MB every 4 steps of 5 ms, two process failures restored from the checkpoint folder.
SUMMARY = {
    "world_size": 1, "goodput": 0.6,
    "checkpoint": {"strategy": "sharded", "per_checkpoint": [
        {"step": step, "level": "", "bytes_written": 1835603, "blocking_s_max": 0.0035, "persist_s_max": 0.0035}
        for step in (4, 8, 12)]},
    "train": {"steps": 32, "step_s_mean": 0.005},
    "failures": {"count": 2, "restarts": [
        {"step": 7, "kind": "process", "level": "", "restored_step": 4, "restore_s": 0.0016, "warmup_s": 0.004},
        {"step": 19, "kind": "process", "level": "", "restored_step": 16, "restore_s": 0.0013, "warmup_s": 0.0037}]},
    "config": {"checkpoint": {"steps_between_checkpoints": 4}, "failures": {"mtbf_s": 0}},
}
QUICK = ["--samples", "50", "--intervals", "2", "--top", "1"]


def run_folder(folder: Path, summary: dict | str = SUMMARY) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    return folder


def refused(capsys, argv: list[str], expected: str, code: int = 2) -> str:
    """The command ends with `code` and one stderr line holding `expected` (a traceback would
    propagate out of main, or print more lines)."""
    assert advise(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dlio_ckpt-advise: error: ") and expected in err, err
    return err


def test_the_minimal_summary_is_advised_on(tmp_path, capsys):
    """The fixture itself: without damage the advice is given (so the refusals below are the damage's)."""
    assert advise([str(run_folder(tmp_path / "run")), "--json", "--no-plot", "--mtbf-s", "60", *QUICK]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["calibration"]["runs"][0]["interval_steps"] == 4 and 0 < doc["advice"]["best"]["goodput"] <= 1


@pytest.mark.parametrize("path,value,expected", [
    (("checkpoint",), "x", "field checkpoint is not a section"),
    (("checkpoint", "per_checkpoint"), 7, "field checkpoint.per_checkpoint is not a list"),
    (("checkpoint", "per_checkpoint", 0, "blocking_s_max"), "0.1", "checkpoint.per_checkpoint[0].blocking_s_max is not a number"),
    (("checkpoint", "per_checkpoint", 1), [1], "checkpoint.per_checkpoint[1] is not a mapping"),
    (("train", "steps"), "32", "field train.steps is not a number"),
    (("train", "steps"), 2.5, "field train.steps is not a whole number"),
    (("world_size",), [1], "field world_size is not a number"),
    (("world_size",), 0, "field world_size is 0"),
    (("failures", "restarts", 0, "restore_s"), {"a": 1}, "failures.restarts[0].restore_s is not a number"),
    (("failures", "count"), -3, "field failures.count is negative"),
    (("config", "failures", "mtbf_s"), "60", "config.failures.mtbf_s is not a number"),
    (("config", "checkpoint"), [], "field config.checkpoint is not a section"),
    (("checkpoint", "per_checkpoint", 0, "blocking_s_max"), 1e308, "blocking_s_max is beyond 1e+09 seconds"),
    (("config", "failures", "mtbf_s"), 1e300, "config.failures.mtbf_s is beyond 1e+09 seconds"),
    (("checkpoint", "per_checkpoint", 0, "bytes_written"), 2.0**64, "bytes_written is not below 2**63 bytes"),
])
def test_a_summary_field_of_the_wrong_type_is_one_line_naming_it(tmp_path, capsys, path, value, expected):
    summary = copy.deepcopy(SUMMARY)
    node = summary
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    folder = run_folder(tmp_path / "run", summary)
    refused(capsys, [str(folder), "--json", "--no-plot", "--mtbf-s", "60", *QUICK], expected)


def test_a_summary_number_that_is_not_finite_is_refused(tmp_path, capsys):
    text = json.dumps(SUMMARY).replace('"step_s_mean": 0.005', '"step_s_mean": NaN')
    refused(capsys, [str(run_folder(tmp_path / "run", text)), "--no-plot", "--mtbf-s", "60", *QUICK],
            "field train.step_s_mean is not a finite number")


def test_a_summary_nested_past_pythons_stack_is_one_line(tmp_path, capsys):
    refused(capsys, [str(run_folder(tmp_path / "run", "[" * 100_000 + "]" * 100_000)), "--no-plot", "--mtbf-s", "60"],
            "cannot read the run summary (maximum recursion depth exceeded")


def test_an_iteration_time_below_a_tenth_of_a_microsecond_is_refused(tmp_path, capsys):
    """1e-300 s iterations made a simulated job of 10 MTBFs 6e302 steps long."""
    summary = copy.deepcopy(SUMMARY)
    summary["train"]["step_s_mean"] = 1e-300
    refused(capsys, [str(run_folder(tmp_path / "run", summary)), "--no-plot", "--mtbf-s", "60", *QUICK],
            "the runs' iteration time is 1e-300 s; the advisor needs a training run whose steps took at least 1e-07 s")


@pytest.mark.parametrize("argv,expected", [
    (["run", "--mtbf-s", "-inf"], "argument --mtbf-s: expected one argument; see dlio_ckpt-advise --help"),
    (["run", "--samples", "1e9"], "argument --samples: invalid int value: '1e9'"),
    ([], "the following arguments are required: RUN_OR_SWEEP_FOLDER"),
])
def test_usage_errors_are_one_line(capsys, argv, expected):
    """argparse printed its usage block (several lines) above the error."""
    with pytest.raises(SystemExit) as ended:
        advise(argv)
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and expected in err, err


def test_a_damaged_run_beside_good_ones_is_skipped_with_a_note(tmp_path, capsys):
    run_folder(tmp_path / "sweep" / "good")
    broken = copy.deepcopy(SUMMARY)
    broken["train"] = "fast"
    run_folder(tmp_path / "sweep" / "broken", broken)
    assert advise([str(tmp_path / "sweep"), "--json", "--no-plot", "--mtbf-s", "60", *QUICK]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [Path(r["path"]).name for r in doc["calibration"]["runs"]] == ["good"]
    assert any("broken" in note and "field train is not a section" in note for note in doc["calibration"]["notes"])


@pytest.mark.parametrize("options,expected", [
    (["--mtbf-s", "nan"], "--mtbf-s: a finite positive number"),
    (["--mtbf-s", "inf"], "--mtbf-s: a finite positive number"),
    (["--mtbf-s", "-1"], "--mtbf-s: a finite positive number"),
    (["--mtbf-s", "1e12"], "at most 1e+09"),
    (["--mtbf-s", "60", "--weibull-shape", "0.01"], "--weibull-shape: 0.3 to 10"),
    (["--mtbf-s", "60", "--weibull-shape", "nan"], "--weibull-shape: 0.3 to 10"),
    (["--mtbf-s", "60", "--samples", "1000000000"], "--samples: 50 to 20,000"),
    (["--mtbf-s", "60", "--intervals", "100000"], "--intervals: 2 to 64"),
    (["--mtbf-s", "60", "--top", "0"], "--top: 1 to 100"),
    (["--mtbf-s", "60", "--seed", "-1"], "--seed: 0 to"),
    (["--mtbf-s", "60", "--world-size", "1000000000"], "--world-size: 1 to 131,072 ranks"),
    (["--mtbf-s", "60", "--node-failure-share", "nan"], "--node-failure-share: a share between 0 and 1"),
])
def test_every_option_has_bounds(tmp_path, capsys, options, expected):
    """Refused before the run folder is read: `--samples 1000000000`, `--weibull-shape 0.01` and
    `--mtbf-s nan` ran for minutes at 1.6 GB, or raised, before."""
    refused(capsys, [str(tmp_path / "nowhere"), "--no-plot", *options], expected)


def test_an_mtbf_shorter_than_an_iteration_is_refused_after_calibration(tmp_path, capsys):
    """--mtbf-s 1e-9 with 5 ms iterations: a failure every step, a simulation that never ends."""
    refused(capsys, [str(run_folder(tmp_path / "run")), "--no-plot", "--mtbf-s", "1e-9", *QUICK],
            "--mtbf-s: an MTBF of 1e-09 s for [sharded/full]; give one from the iteration time (0.005 s")


def test_a_runs_own_mtbf_too_short_for_the_advised_scale_is_refused(tmp_path, capsys):
    summary = copy.deepcopy(SUMMARY)
    summary["config"]["failures"]["mtbf_s"] = 0.001
    refused(capsys, [str(run_folder(tmp_path / "run", summary)), "--no-plot", *QUICK],
            "the runs' failures.mtbf_s scaled to the world size: an MTBF of 0.001 s")


@pytest.mark.parametrize("target,expected", [
    ("/proc/advice.png", "is under /proc, a kernel file system"),
    ("/sys/advice.png", "is under /sys, a kernel file system"),
    ("/dev/null", "/dev/null exists and is not a file"),
    ("{tmp}", "exists and is not a file"),
    ("{tmp}/a_file/advice.png", "a_file is a file, so no folder can be made there"),
])
def test_a_plot_path_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys, target, expected):
    folder = run_folder(tmp_path / "run")
    (tmp_path / "a_file").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    refused(capsys, [str(folder), "--mtbf-s", "60", "--plot", target.format(tmp=tmp_path), *QUICK], expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == before and os.path.exists("/dev/null")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a folder without write permission")
def test_a_plot_in_a_read_only_folder_is_refused_before_the_work(tmp_path, capsys):
    folder = run_folder(tmp_path / "run")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        refused(capsys, [str(folder), "--mtbf-s", "60", "--plot", str(locked / "advice.png"), *QUICK],
                f"--plot: cannot write in {locked} (Permission denied)")
    finally:
        locked.chmod(0o755)
    assert list(locked.iterdir()) == []


def test_the_plot_is_written_whole_under_its_name_with_nothing_beside_it(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    folder = run_folder(tmp_path / "run")
    target = tmp_path / "out" / "advice.png"
    assert advise([str(folder), "--mtbf-s", "60", "--plot", str(target), *QUICK]) == 0
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.listdir(target.parent) == ["advice.png"]
    assert target.stat().st_mode & 0o777 == 0o644


# --- DLIO and workload YAML files: nesting, aliases, size -------------------------------------

DLIO_FILE = Path(__file__).parent / "data" / "dlio" / "indexed_all_ranks.yaml"


def nested(depth: int) -> str:
    return "dataset: " + "{a: " * depth + "1" + "}" * depth + "\n"


def alias_bomb() -> str:
    """Nine lines, 10**9 values once the aliases are expanded ("billion laughs")."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text,expected", [
    (nested(5000), "nested more than Python can parse"),
    ("model: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than Python can parse"),
    (nested(40), "nested more than 32 levels deep"),
    (alias_bomb(), "more than 100,000 values (YAML aliases counted where used)"),
])
def test_a_dlio_yaml_nested_or_aliased_past_any_workload_is_one_line(tmp_path, capsys, text, expected):
    from dlio_ckpt.import_dlio import main as import_dlio

    source = tmp_path / "deep.yaml"
    source.write_text(text)
    with pytest.raises(SystemExit) as ended:
        import_dlio([str(source), "-o", str(tmp_path / "out.yaml")])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and expected in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep.yaml"]


@pytest.mark.parametrize("key", ["dlio_config", "workload"])
def test_a_nested_yaml_in_dlio_config_or_workload_is_refused_by_the_loader(tmp_path, key):
    """`dlio_config=PATH` and `workload=PATH` read the file through the same bounded parser."""
    from dlio_ckpt.config.load import load_config
    from dlio_ckpt.errors import ConfigError

    source = tmp_path / "deep.yaml"
    source.write_text(nested(5000))
    with pytest.raises(ConfigError, match="nested more than Python can parse"):
        load_config([f"{key}={source}", "scale=tiny"])


@pytest.mark.parametrize("target,expected", [
    ("/proc/workload.yaml", "-o: /proc/workload.yaml is under /proc, a kernel file system"),
    ("/dev/null", "-o: /dev/null exists and is not a file"),
    ("{tmp}", "exists and is not a file"),
    ("{tmp}/missing/workload.yaml", "missing is not a folder"),
])
def test_import_output_that_cannot_take_the_file_is_refused(tmp_path, capsys, target, expected):
    """-o /proc/... was a traceback; -o /dev/null (as root) replaced the device with the YAML."""
    from dlio_ckpt.import_dlio import main as import_dlio

    before = sorted(os.listdir(tmp_path))
    with pytest.raises(SystemExit) as ended:
        import_dlio([str(DLIO_FILE), "-o", target.format(tmp=tmp_path)])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.count("\n") == 1 and expected in err, err
    assert sorted(os.listdir(tmp_path)) == before and Path("/dev/null").is_char_device()


# --- config numbers: nan and inf; failures.at_steps past the run ------------------------------

def config_refused(overrides: list[str], expected: str, world_size: int = 1) -> None:
    from dlio_ckpt.config.load import validate_command_line
    from dlio_ckpt.errors import ConfigError

    with pytest.raises(ConfigError) as error:
        validate_command_line(overrides, multirun=False, world_size=world_size)
    assert expected in str(error.value) and "\n" not in str(error.value), str(error.value)


@pytest.mark.parametrize("override,expected", [
    ("failures.mtbf_s=nan", "failures.mtbf_s: must be a finite number (got nan)"),
    ("failures.mtbf_s=inf", "failures.mtbf_s: must be a finite number (got inf)"),
    ("failures.mtbf_s=-1", "failures.mtbf_s: must be a finite positive number of seconds, or 0"),
    ("train.computation_time=nan", "train.computation_time: must be a finite number (got nan)"),
    ("train.computation_time=inf", "train.computation_time: must be a finite number (got inf)"),
    ("checkpoint.sleep_between_s=inf", "checkpoint.sleep_between_s: must be a finite number"),
    ("checkpoint.seconds_between_checkpoints=nan", "checkpoint.seconds_between_checkpoints: must be a finite number"),
    ("datasize.memory_multiple=inf", "datasize.memory_multiple: must be a finite number"),
    ("train.computation_time=1e308", "train.computation_time: at most 1e+06 seconds (got 1e+308)"),
    ("train.computation_time_stdev=2e6", "train.computation_time_stdev: at most 1e+06 seconds"),
    ("train.first_step_time=nan", "train.first_step_time: must be a finite number (got nan)"),
    ("train.first_step_time=-0.5", "train.first_step_time: cannot be negative (got -0.5)"),
    ("train.first_step_time=2e6", "train.first_step_time: at most 1e+06 seconds"),
    ("evaluation.computation_time=1e7", "evaluation.computation_time: at most 1e+06 seconds"),
    ("checkpoint.sleep_between_s=1e300", "checkpoint.sleep_between_s: at most 1e+06 seconds"),
    ("checkpoint.seconds_between_checkpoints=1e10", "checkpoint.seconds_between_checkpoints: at most 1e+09 seconds"),
    ("failures.mtbf_s=1e308", "failures.mtbf_s: at most 1e+09 seconds"),
])
def test_config_numbers_must_be_finite(override, expected):
    """nan passed every `>= 0` check (mtbf_s=nan was then refused as "cannot be negative" only by
    accident of its message), and inf made times infinite: every float key is checked in one place."""
    config_refused(["workload=unet3d", "scale=tiny", override], expected)


TINY_RUN = ["workload=unet3d", "scale=tiny", "train.step_counting=global", "reader.drop_last=false", "reader.batch_size=3",
            "checkpoint.enabled=true", "checkpoint.steps_between_checkpoints=2", "progress=false"]


def test_a_failure_step_past_the_last_step_is_refused_and_the_last_step_still_strikes(workdir):
    """unet3d tiny with batches of 3 and the last one kept runs 6 steps: a failure at step 7 would
    inject nothing (silently, before); one at step 6 is injected."""
    from conftest import load_summary, run_cli

    config_refused([*TINY_RUN, "failures.at_steps=[2,7]"],
                   "failures.at_steps: step 7 is after the run's last step (6 with 1 rank")
    done = run_cli([*TINY_RUN, "failures.at_steps=[6]", f"storage.root={workdir / 'store'}",
                    f"hydra.run.dir={workdir / 'run'}"], cwd=workdir / "cwd")
    assert done.returncode == 0, done.stderr
    summary = load_summary(workdir / "run")
    assert summary["train"]["steps"] == 6 and [r["step"] for r in summary["failures"]["restarts"]] == [6]


@pytest.mark.parametrize("world_size,options,last", [
    (3, ["train.step_counting=global", "reader.drop_last=false", "reader.batch_size=2", "dataset.num_files_train=7",
         "dataset.num_samples_per_file=1", "train.epochs=2"], 4),  # shares 3, 2, 2: rank 0 runs 2 batches an epoch
    (2, ["train.step_counting=dlio", "reader.batch_size=2", "dataset.num_files_train=9", "dataset.num_samples_per_file=1",
         "train.epochs=3"], 6),  # floor(9 / 2 / 2) = 2 an epoch
    (1, ["train.step_counting=global", "train.total_steps=5", "reader.batch_size=1", "dataset.num_files_train=8",
         "dataset.num_samples_per_file=1", "train.epochs=3"], 5),
])
def test_the_last_step_is_the_engines_for_any_world_size(world_size, options, last):
    """The bound is exact: the last step passes, the next is refused (the 3-rank case was measured
    under mpirun: summary train.steps_per_rank [4, 2, 2])."""
    from dlio_ckpt.config.load import validate_command_line

    base = ["workload=unet3d", "scale=tiny", *options]
    validate_command_line([*base, f"failures.at_steps=[{last}]"], multirun=False, world_size=world_size)
    config_refused([*base, f"failures.at_steps=[{last + 1}]"], f"after the run's last step ({last} with", world_size)


def test_failure_steps_past_the_end_stay_allowed_where_mtbf_s_feeds_the_policy():
    """docs/failures.md: with at_steps set, mtbf_s only feeds the policy's interval; steps past the
    end are how a run gets young_daly's interval with no failure injected (tests/test_policy.py)."""
    from dlio_ckpt.config.load import validate_command_line

    validate_command_line([*TINY_RUN, "failures.at_steps=[1000]", "failures.mtbf_s=0.001", "checkpoint.policy=young_daly"],
                          multirun=False)


# --- a closed handle: ValueError, never another file's bytes ----------------------------------

from test_traced_posix import WrappedPosix, tracer  # noqa: E402,F401  (the fixture: C and pure-Python tracer)


def _reads_after_close(handle, held) -> list[str]:
    """Each read call on a closed handle, and the call held from before the close: what each raised."""
    calls = {
        "read_at_into": lambda: handle.read_at_into(bytearray(8), 0),
        "held read_at_into": lambda: held(bytearray(8), 0),
        "readinto": lambda: handle.readinto(bytearray(8)),
        "read": lambda: handle.read(8),
        "read all": lambda: handle.read(),
        "read_at": lambda: handle.read_at(0, 8),
        "write": lambda: handle.write(b"x"),
        "fsync": lambda: handle.fsync(),
        "size": lambda: handle.size(),
    }
    raised = []
    for name, call in calls.items():
        try:
            result = call()
        except ValueError as exc:
            assert str(exc) == "I/O operation on closed file.", (name, exc)
            raised.append(name)
        except OSError:
            pass
        else:
            pytest.fail(f"{name} on a closed handle returned {result!r}")
    return raised


@pytest.mark.parametrize("backend", ["traced", "wrapped", "plain"])
def test_a_read_after_close_raises_instead_of_reading_the_file_that_took_its_descriptor(tmp_path, tracer, backend):
    """The descriptor number of a closed handle is the next file's: a read through the closed
    handle read that file's bytes, silently, in the C tracer and the pure-Python one (and on a
    plain handle). Now every read raises ValueError, as a closed Python file's does, and the
    tracer records nothing for it."""
    from dlio_ckpt.storage.events import EventRecorder, JobClock
    from dlio_ckpt.storage.posix import PosixStorage
    from dlio_ckpt.storage.traced import TracedStorage

    (tmp_path / "closed.bin").write_bytes(b"A" * 64)
    (tmp_path / "secret.bin").write_bytes(b"S" * 64)
    recorder = EventRecorder(rank=0, clock=JobClock.start())
    inner = WrappedPosix() if backend == "wrapped" else PosixStorage()
    storage = inner if backend == "plain" else TracedStorage(inner, recorder).with_phase("train")
    handle = storage.open_read(str(tmp_path / "closed.bin"))
    for _ in range(3):  # the pure-Python tracer's closure takes over from the second read
        assert handle.read_at_into(bytearray(4), 0) == 4
    held = handle.read_at_into
    number = handle.fileno()
    events = len(recorder.array())
    handle.close()
    other = os.open(tmp_path / "secret.bin", os.O_RDONLY)
    try:
        assert other == number  # the kernel reuses the lowest free number: the closed handle's
        raised = _reads_after_close(handle, held)
    finally:
        os.close(other)
    assert raised == ["read_at_into", "held read_at_into", "readinto", "read", "read all", "read_at", "write",
                      "fsync", "size"]
    assert len(recorder.array()) == events + (0 if backend == "plain" else 1)  # the close, nothing after



# --- an S3 write handle dropped unclosed ------------------------------------------------------

@pytest.mark.parametrize("traced", [False, True])
@pytest.mark.parametrize("opener", ["open_write", "open_staged"])
def test_an_s3_write_handle_dropped_unclosed_after_a_part_aborts_its_upload(s3_server, s3_bucket, opener, traced):
    """Its uploader thread held the handle alive, so it was never collected: the thread lived on
    and the multipart upload stayed incomplete on the server (docs: a handle nobody closed is
    discarded). Now dropping it ends the thread, aborts the upload and publishes nothing."""
    import gc
    import threading

    from test_s3_storage import PART, ROOT, pending_uploads, server_objects, storage

    from dlio_ckpt.storage.events import EventRecorder, JobClock
    from dlio_ckpt.storage.traced import TracedStorage

    backend = storage(s3_server, s3_bucket)
    if traced:
        backend = TracedStorage(backend, EventRecorder(rank=0, clock=JobClock.start())).with_phase("checkpoint")
    handle = getattr(backend, opener)(f"{ROOT}/ckpt/dropped.bin")
    handle.write(b"x" * (PART + PART // 2))  # the first part is handed to the upload, half a part is pending
    name = "s3-upload runs/p/ckpt/dropped.bin"
    assert [t.name for t in threading.enumerate()].count(name) == 1
    del handle
    gc.collect()
    assert name not in [t.name for t in threading.enumerate()]
    assert pending_uploads(s3_server, s3_bucket) == [] and server_objects(s3_server, s3_bucket) == {}


# --- storage.root: a missing root is announced; kernel folders are refused --------------------

@pytest.mark.parametrize("root", ["/proc/dlio", "/sys/fs/dlio", "/dev/dlio", "/proc"])
def test_a_storage_root_under_a_kernel_folder_is_refused(root):
    config_refused(["workload=unet3d", "scale=tiny", f"storage.root={root}"],
                   f"storage.root: {root} is under /{root.split('/')[1]}, a kernel file system, not storage")


def test_a_level_path_under_a_kernel_folder_is_refused(tmp_path):
    levels = ("checkpoint.levels=[{name: local, path: /proc/dlio_level, scope: node}, "
              "{name: shared, every: 2, write: flush}]")
    config_refused(["workload=unet3d", "scale=tiny", "checkpoint.enabled=true", f"storage.root={tmp_path / 'store'}", levels],
                   "checkpoint.levels[0].path: '/proc/dlio_level' is under /proc, a kernel file system")


def test_dev_shm_stays_a_storage_root():
    """/dev/shm is a RAM disk, the node-local level of docs/levels.md: not refused with /dev."""
    from dlio_ckpt.storage.posix import system_folder

    assert system_folder("/dev/shm/dlio") is None and system_folder("/dev/shmx") == "/dev"
    assert system_folder("/proc") == "/proc" and system_folder("/process") is None


def test_a_missing_storage_root_is_created_and_said_once_with_its_file_system(workdir):
    """A typo in storage.root used to make a new folder silently, on whatever file system held its
    parent. The run still makes it (a new root is a normal first run), in one line on stdout."""
    from conftest import run_cli

    from dlio_ckpt.storage.posix import file_system

    root = workdir / "typo" / "store"
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", f"storage.root={root}",
                    f"hydra.run.dir={workdir / 'run'}"], cwd=workdir / "cwd")
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stdout.splitlines() if "storage.root" in line and "did not exist" in line]
    assert notes == [f"dlio_ckpt: note: storage.root {root} did not exist; created it, on {file_system(str(root))} "
                     "(check storage.root if you meant an existing folder)"]
    assert root.is_dir() and " mounted at " in notes[0]
    again = run_cli(["workload=unet3d", "scale=tiny", "progress=false", f"storage.root={root}",
                     f"hydra.run.dir={workdir / 'run2'}"], cwd=workdir / "cwd")
    assert again.returncode == 0 and "did not exist" not in again.stdout + again.stderr
