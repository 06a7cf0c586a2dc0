"""`dlio_ckpt clean` removes only what the run itself marked as its own (issue 24, "Deleting what is
not ours"): an edited, copied or damaged summary, another run's folder, a link in any component, an
empty or implicit argument, a dataset a live run is reading: nothing outside the run is removed.
Also the relaunch after failures.restart=exit: a link swapped in for its checkpoint folder, another
storage.root, another rank count are refused, and the note stays for the right relaunch."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, cli_env, load_summary, run_cli
from dlio_ckpt.engine.ownership import LEASE, OWNER_MARKER, RUN_MARKER, DatasetLease, claim_folder, mark_dataset, write_run_marker
from dlio_ckpt.storage.posix import PosixStorage

TINY = ["workload=unet3d", "scale=tiny", "dataset.format=raw", "progress=false", "checkpoint.enabled=true",
        "checkpoint.steps_between_checkpoints=2"]


def make_run(base: Path, name: str, root: Path, workload: str = "w", fingerprint: str = "fp1") -> dict:
    """A run folder and the folders a run of it made under `root`, marked as a run marks them."""
    run = base / name
    run.mkdir(parents=True)
    run_id = f"{name}-0123abcd"
    write_run_marker(run, run_id)
    backend = PosixStorage(str(root))
    checkpoints = root / "checkpoints" / run_id
    claim_folder(backend, str(checkpoints), run_id, run, "checkpoint")
    (checkpoints / "step_00000001").mkdir()
    (checkpoints / "step_00000001" / "shard.bin").write_bytes(b"c" * 100)
    dataset = root / "data" / workload / fingerprint
    (dataset / "train").mkdir(parents=True)
    (dataset / "train" / "f0.bin").write_bytes(b"d" * 100)
    mark_dataset(backend, str(dataset), run_id, run)
    summary = {"run_dir": str(run),
               "config": {"mode": "train", "workload": workload,
                          "storage": {"backend": "posix", "root": str(root), "direct_io": False},
                          "checkpoint": {"folder": "checkpoints", "levels": []}},
               "dataset": {"folder": str(dataset), "reused": False},
               "created": {"storage_root": str(root), "checkpoints": str(checkpoints), "dataset": str(dataset),
                           "checkpoint_levels": []}}
    (run / "summary.json").write_text(json.dumps(summary))
    return {"run": run, "id": run_id, "checkpoints": checkpoints, "dataset": dataset, "summary": summary}


def edit(run: Path, change) -> None:
    summary = json.loads((run / "summary.json").read_text())
    change(summary)
    (run / "summary.json").write_text(json.dumps(summary))


def victim(folder: Path) -> Path:
    """A folder with a file in it that no clean may remove."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "precious.txt").write_text("keep me")
    return folder


def clean(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    done = run_cli(["clean", *args], cwd)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def refused(done: subprocess.CompletedProcess, words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and words in lines[0], done.stderr


def test_a_marked_run_is_removed_and_nothing_else(tmp_path):
    root = tmp_path / "store"
    a, b = make_run(tmp_path, "a", root), make_run(tmp_path, "b", root, fingerprint="fp2")
    dry = clean(["--dry-run", str(a["run"])], tmp_path)
    assert dry.returncode == 0 and a["checkpoints"].is_dir() and a["dataset"].is_dir()
    assert f"would remove checkpoints {a['checkpoints']}" in dry.stdout
    assert f"would remove dataset {a['dataset']}" in dry.stdout
    assert not (a["dataset"] / LEASE).exists()  # a dry run writes nothing
    done = clean([str(a["run"])], tmp_path)
    assert done.returncode == 0, done.stderr
    assert not a["checkpoints"].exists() and not a["dataset"].exists()
    assert b["checkpoints"].is_dir() and (b["dataset"] / "train" / "f0.bin").is_file()
    assert (a["run"] / "summary.json").is_file()
    again = clean([str(a["run"])], tmp_path)
    assert again.returncode == 0 and "nothing of this run's left" in again.stdout


def test_a_reused_dataset_is_kept(tmp_path):
    root = tmp_path / "store"
    a = make_run(tmp_path, "a", root)
    edit(a["run"], lambda s: s["dataset"].update(reused=True))
    done = clean([str(a["run"])], tmp_path)
    assert done.returncode == 0 and f"dataset {a['dataset']} kept: this run reused it" in done.stdout
    assert a["dataset"].is_dir() and not a["checkpoints"].exists()


def test_paths_in_an_edited_summary_are_never_removed(tmp_path):
    root = tmp_path / "store"
    a, b = make_run(tmp_path, "a", root), make_run(tmp_path, "b", root, fingerprint="fp2")
    outside = victim(tmp_path / "outside")
    level_victim = victim(tmp_path / "level" / a["id"])

    def attack(s):  # every path the old clean trusted, pointed elsewhere
        s["created"] = {"storage_root": "/", "checkpoints": str(b["checkpoints"]), "dataset": str(outside),
                        "checkpoint_levels": [{"folder": str(tmp_path), "checkpoints": str(outside), "backend": "posix"}]}
        s["config"]["checkpoint"]["levels"] = [{"name": "evil", "path": str(tmp_path / "level"), "backend": None}]
        s["dataset"]["folder"] = str(b["dataset"])
    edit(a["run"], attack)
    done = clean([str(a["run"])], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (outside / "precious.txt").is_file() and (level_victim / "precious.txt").is_file()
    assert b["checkpoints"].is_dir() and b["dataset"].is_dir()
    assert not a["checkpoints"].exists()  # its own folder, found by its run id below storage.root, still goes
    assert f"names run '{b['id']}'" in done.stdout and "not marked by a run" in done.stdout


def test_a_root_of_slash_or_climbing_folders_offer_nothing(tmp_path):
    root = tmp_path / "store"
    a = make_run(tmp_path, "a", root)
    edit(a["run"], lambda s: s["config"]["storage"].update(root="/"))
    dry = clean(["--dry-run", str(a["run"])], tmp_path)
    assert dry.returncode == 0 and "would remove" not in dry.stdout and "file system's root" in dry.stdout

    def climb(s):
        s["config"]["storage"]["root"] = str(root)
        s["config"]["checkpoint"]["folder"] = "../../.."
        s["dataset"]["folder"] = "/etc"
    edit(a["run"], climb)
    dry = clean(["--dry-run", str(a["run"])], tmp_path)
    assert dry.returncode == 0 and "would remove" not in dry.stdout
    assert "not a folder below storage.root" in dry.stdout and "dataset /etc kept: not below storage.root" in dry.stdout


def test_another_runs_id_or_a_copied_run_folder_removes_nothing(tmp_path):
    root = tmp_path / "store"
    a, b = make_run(tmp_path, "a", root), make_run(tmp_path, "b", root, fingerprint="fp2")
    (a["run"] / RUN_MARKER).write_text(json.dumps({"run_id": b["id"]}))  # a names b's run id
    edit(a["run"], lambda s: s["dataset"].update(folder=str(b["dataset"])))
    done = clean([str(a["run"])], tmp_path)
    assert done.returncode == 0 and "would remove" not in done.stdout and "removed" not in done.stdout
    assert "a copy of a run folder?" in done.stdout
    copy = tmp_path / "b-copy"
    shutil.copytree(b["run"], copy)
    done = clean([str(copy)], tmp_path)
    assert done.returncode == 0 and "removed" not in done.stdout
    assert b["checkpoints"].is_dir() and b["dataset"].is_dir()
    moved = tmp_path / "b-moved"  # moving a run folder keeps it (its inode): it still cleans
    b["run"].rename(moved)
    done = clean([str(moved)], tmp_path)
    assert done.returncode == 0 and not b["checkpoints"].exists() and not b["dataset"].exists()


@pytest.mark.parametrize("component", ["root-is-link", "checkpoints", "run-folder", "data", "dataset"])
def test_a_link_in_any_component_is_never_followed(tmp_path, component):
    real_root = tmp_path / "real-store"
    a = make_run(tmp_path, "a", real_root)
    elsewhere = tmp_path / "elsewhere"
    if component == "root-is-link":  # storage.root itself may be a link: clean works on its realpath
        link = tmp_path / "store"
        link.symlink_to(real_root)
        edit(a["run"], lambda s: s["config"]["storage"].update(root=str(link)))
        edit(a["run"], lambda s: s["dataset"].update(folder=str(link / "data" / "w" / "fp1")))
        done = clean([str(a["run"])], tmp_path)
        assert done.returncode == 0 and not a["checkpoints"].exists() and not a["dataset"].exists()
        return
    # the folder (or one above it) is moved away and a link to it put in its place: the marker is
    # the run's, but reached through a link, so it stays
    moved = {"checkpoints": real_root / "checkpoints", "run-folder": a["checkpoints"],
             "data": real_root / "data", "dataset": a["dataset"]}[component]
    moved.rename(elsewhere)
    moved.symlink_to(elsewhere)
    done = clean([str(a["run"])], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "symbolic link" in done.stdout
    assert elsewhere.is_dir() and moved.is_symlink()
    assert any(elsewhere.rglob("*.bin"))


def test_an_empty_or_implicit_argument_is_refused(tmp_path):
    root = tmp_path / "runs-store"
    a, b = make_run(tmp_path, "a", root), make_run(tmp_path, "b", root, fingerprint="fp2")
    for args in ([""], ["  "], [str(a["run"]), ""], ["."], ["/"]):
        done = clean(args, tmp_path)  # the current folder holds run folders a and b, but is no sweep folder
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    assert "empty folder name" in clean([""], tmp_path).stderr
    assert "not a sweep folder" in clean(["."], tmp_path).stderr
    for run in (a, b):
        assert run["checkpoints"].is_dir() and run["dataset"].is_dir()
    (tmp_path / "multirun.yaml").write_text("{}")  # a sweep folder, named explicitly: its jobs go
    done = clean(["--dry-run", "."], tmp_path)
    assert done.returncode == 0 and done.stdout.count("would remove checkpoints") == 2


DAMAGED = {
    "truncated": lambda text: text[: len(text) // 2],
    "not JSON": lambda text: "this is not json {",
    "wrong types": lambda text: json.dumps({**json.loads(text), "config": {"storage": {"root": 5, "backend": []}}}),
    "missing keys": lambda text: json.dumps({"run_dir": "x"}),
    "nested": lambda text: "[" * 200_000 + "]" * 200_000,
}


@pytest.mark.parametrize("kind", [*DAMAGED, "huge", "not an object", "levels"])
def test_a_damaged_summary_is_one_line_and_exit_2(tmp_path, kind):
    root = tmp_path / "store"
    a = make_run(tmp_path, "a", root)
    path = a["run"] / "summary.json"
    if kind == "huge":
        with open(path, "r+b") as handle:
            handle.truncate(65 << 20)  # sparse: nothing written, but 65 MiB to read
    elif kind == "not an object":
        path.write_text("[1, 2]")
    elif kind == "levels":
        edit(a["run"], lambda s: s["config"]["checkpoint"].update(levels=["x", 3]))
    else:
        path.write_text(DAMAGED[kind](path.read_text()))
    done = clean([str(a["run"])], tmp_path)
    refused(done, str(a["run"]))
    assert a["checkpoints"].is_dir() and a["dataset"].is_dir()


def test_a_dataset_another_live_run_holds_is_kept(tmp_path):
    root = tmp_path / "store"
    a = make_run(tmp_path, "a", root)
    lease = DatasetLease(PosixStorage(str(root)), str(a["dataset"]), is_root=True)
    lease.take()  # as a run reusing the dataset holds it
    try:
        done = clean([str(a["run"])], tmp_path)
    finally:
        lease.release()
    assert done.returncode == 0 and "a running run is using it" in done.stdout
    assert (a["dataset"] / "train" / "f0.bin").is_file() and not a["checkpoints"].exists()
    done = clean([str(a["run"])], tmp_path)  # the run ended: now it goes
    assert done.returncode == 0 and not a["dataset"].exists()


def _lease_held(dataset: Path) -> bool:
    try:
        fd = os.open(dataset / LEASE, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_clean_of_the_generating_run_never_kills_a_run_reusing_its_dataset(workdir):
    store = workdir / "store"
    first = run_cli([*TINY, "mode=generate", f"storage.root={store}", f"hydra.run.dir={workdir / 'first'}"], workdir / "cwd")
    assert first.returncode == 0, first.stderr[-2000:]
    dataset = Path(load_summary(workdir / "first")["dataset"]["folder"])
    # a second run reuses the dataset, slowly; the first run is cleaned while it trains
    second = subprocess.Popen([str(BIN / "dlio_ckpt"), *TINY, "train.computation_time=0.6", "checkpoint.enabled=false", f"storage.root={store}",
                               f"hydra.run.dir={workdir / 'second'}"], cwd=workdir / "cwd", env=cli_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while second.poll() is None and not _lease_held(dataset):
        time.sleep(0.05)
    done = clean([str(workdir / "first")], workdir / "cwd")
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-2000:]
    assert done.returncode == 0 and "a running run is using it" in done.stdout, done.stdout
    assert load_summary(workdir / "second")["dataset"]["reused"] is True
    assert any((dataset / "train").iterdir())


def test_clean_of_an_s3_run_names_s3_urls(workdir, s3_server, s3_bucket):
    run = workdir / "run"
    done = run_cli(["workload=unet3d", "scale=tiny", "dataset.format=raw", "progress=false", "checkpoint.enabled=true",
                    "checkpoint.drop_caches=false", "storage.backend=s3", f"storage.s3.bucket={s3_bucket}",
                    f"storage.s3.endpoint_url={s3_server.endpoint_url}", "storage.s3.prefix=cl",
                    f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr[-2000:]
    run_id = Path(load_summary(run)["created"]["checkpoints"]).name
    dry = clean(["--dry-run", str(run)], workdir / "cwd")
    assert dry.returncode == 0, dry.stderr
    assert f"would remove checkpoints s3://{s3_bucket}/cl/checkpoints/{run_id}" in dry.stdout
    assert f"dataset s3://{s3_bucket}/cl/data/unet3d/" in dry.stdout and str(workdir / "store") not in dry.stdout
    done = clean([str(run)], workdir / "cwd")
    keys = [o["Key"] for page in s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=s3_bucket, Prefix="cl/")
            for o in page.get("Contents", [])]
    assert done.returncode == 0 and keys and not any(f"/{run_id}/" in k for k in keys)
    assert any("/data/unet3d/" in k for k in keys)  # an object store's dataset stays (no lease there)


# the relaunch after failures.restart=exit ---------------------------------------------------------

RESTART = [*TINY, "dataset.num_files_train=32", "dataset.num_samples_per_file=1", "reader.batch_size=2", "train.epochs=1",
           "train.computation_time=0", "checkpoint.keep_last=0", "failures.at_steps=[5]", "failures.restart=exit"]


def stopped_run(workdir: Path) -> tuple[Path, Path]:
    run = workdir / "run"
    first = run_cli([*RESTART, f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert first.returncode == 75, first.stderr[-2000:]
    run_id = json.loads((run / RUN_MARKER).read_text())["run_id"]
    return run, workdir / "store" / "checkpoints" / run_id


def test_a_relaunch_never_follows_a_link_swapped_in_for_its_checkpoint_folder(workdir):
    run, checkpoints = stopped_run(workdir)
    outside = workdir / "outside"
    checkpoints.rename(outside)
    checkpoints.symlink_to(outside)
    before = sorted(p.name for p in outside.rglob("*"))
    again = run_cli([*RESTART, f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd")
    refused(again, "symbolic link")
    assert sorted(p.name for p in outside.rglob("*")) == before  # nothing written through the link
    assert (run / ".dlio_ckpt_resume").exists()  # the note stays for a relaunch once the link is gone


def relaunched_right(workdir: Path, run: Path, checkpoints: Path) -> None:
    assert (run / ".dlio_ckpt_resume").exists()
    right = run_cli([*RESTART, f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert right.returncode == 0, right.stderr[-2000:]
    (restart,) = load_summary(run)["failures"]["restarts"]
    assert restart["restart"] == "exit" and restart["restored_step"] == 4
    assert (checkpoints / OWNER_MARKER).is_file()


def test_a_relaunch_with_another_root_is_refused_and_the_right_one_resumes(workdir):
    run, checkpoints = stopped_run(workdir)
    other = workdir / "other-store"
    moved = run_cli([*RESTART, f"storage.root={other}", f"hydra.run.dir={run}"], workdir / "cwd")
    refused(moved, "storage.root")
    assert not other.exists()
    relaunched_right(workdir, run, checkpoints)


@pytest.mark.mpi
def test_a_relaunch_with_another_rank_count_is_refused_and_the_right_one_resumes(workdir):
    run, checkpoints = stopped_run(workdir)
    wider = run_cli([*RESTART, f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd", mpi_ranks=2)
    assert wider.returncode == 2 and "relaunch it with as many" in wider.stderr, wider.stderr[-2000:]
    assert "Traceback" not in wider.stderr
    relaunched_right(workdir, run, checkpoints)


@pytest.mark.parametrize("where", ["run marker", "owner marker", "lease"])
def test_a_fifo_in_a_markers_place_neither_hangs_nor_counts(tmp_path, where):
    root = tmp_path / "store"
    a = make_run(tmp_path, "a", root)
    path = {"run marker": a["run"] / RUN_MARKER, "owner marker": a["checkpoints"] / OWNER_MARKER,
            "lease": a["dataset"] / LEASE}[where]
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    done = run_cli(["clean", str(a["run"])], tmp_path, timeout=60)
    assert "Traceback" not in done.stderr
    if where == "run marker":
        refused(done, RUN_MARKER)
    else:
        assert done.returncode == 0 and "kept:" in done.stdout
        assert (a["checkpoints"] if where == "owner marker" else a["dataset"]).is_dir()
