"""One verdict per run (issue 27, item 5): the verdict, AU target and storage lines never disagree.

Unit tests judge constructed figures with the pure function (metrics/verdict.py), one per pair of
lines that used to contradict each other, plus a grid over all the evidence checking every pair
at once; end-to-end runs parse the printed table and summary.json of tiny runs.
"""

from __future__ import annotations

import itertools
import json

import pytest

from conftest import load_summary, run_cli
from dlio_ckpt.config.load import load_config
from dlio_ckpt.metrics import report
from dlio_ckpt.metrics import summary as summaries
from dlio_ckpt.metrics.verdict import MIN_STEPS_TO_JUDGE, Evidence, judge


def evidence(**changes) -> Evidence:
    """A run long enough to judge, missing its AU target, whose storage delivers 2x what it needs."""
    base = dict(fewest_steps=20, au_overall=0.5, au_target=0.9, required_mib_per_s=100.0, delivered_mib_per_s=200.0,
                data_wait_share=0.4, checkpoint_share=0.0, page_cache_risk=False)
    return Evidence(**{**base, **changes})


def says_storage_bound(line: str) -> bool:
    return "storage-bound" in line.replace("not storage-bound", "")


# -- each pair that used to contradict ----------------------------------------------------------

def test_too_few_steps_judges_neither_the_au_nor_the_storage():
    """2 steps: the AU line said 'too few steps to judge' while the storage line said 'storage-bound'."""
    judged = judge(evidence(fewest_steps=2, delivered_mib_per_s=50.0))
    assert judged["verdict"] == "too_few_steps" and judged["au_verdict"] == "too few steps to judge"
    assert judged["au_target_met"] is None and judged["storage_bound"] is None
    assert judged["storage_line"].startswith("not judged (too few steps): delivered 50.0 MiB/s, required 100.0 MiB/s")
    assert not says_storage_bound(judged["line"] + judged["storage_line"])
    assert "only 2 steps" in judged["line"] and "only 2 steps" in judged["au_verdict_reason"]


def test_slow_reads_from_the_page_cache_blame_the_reader_not_the_storage():
    """'storage-bound' and 'the reader limits this run' were printed together."""
    judged = judge(evidence(delivered_mib_per_s=40.0, page_cache_risk=True))
    assert judged["verdict"] == "reader" and judged["limited_by"] == "input pipeline"
    assert judged["storage_bound"] is None
    assert judged["storage_line"].startswith("not measured: reads likely served from the page cache")
    assert not says_storage_bound(judged["line"] + judged["storage_line"])
    assert "0.40x" in judged["line"] and "reader.read_threads" in judged["line"]


def test_slow_reads_from_storage_are_storage_bound_and_nothing_else_is_blamed():
    judged = judge(evidence(delivered_mib_per_s=40.0))
    assert judged["verdict"] == "storage" and judged["storage_bound"] is True
    assert judged["line"].startswith("AU target NOT met: storage-bound: the storage delivered 0.40x")
    assert judged["storage_line"].startswith("storage-bound: delivered 40.0 MiB/s, required 100.0 MiB/s (0.40x")
    assert "2.5x its rate" in judged["storage_line"]
    assert "input pipeline" not in judged["line"] and "page cache" not in judged["line"]


def test_fast_reads_from_the_page_cache_do_not_claim_the_storage_is_fast():
    """'not storage-bound ... yet training waited for data 28%' beside a warning that the rate may
    be the page cache's: the storage was not measured, and the line says so."""
    judged = judge(evidence(delivered_mib_per_s=660.0, data_wait_share=0.28, page_cache_risk=True))
    assert judged["verdict"] == "input_pipeline" and judged["storage_bound"] is None
    assert "not storage-bound" not in judged["storage_line"]
    assert judged["storage_line"].startswith("not measured: reads likely served from the page cache")
    assert "waited for data 28.0%" in judged["line"] and "storage itself was not measured" in judged["line"]


def test_fast_storage_and_long_waits_blame_the_input_pipeline():
    judged = judge(evidence(delivered_mib_per_s=660.0, data_wait_share=0.28))
    assert judged["verdict"] == "input_pipeline" and judged["storage_bound"] is False
    assert judged["storage_line"].startswith("not storage-bound: delivered 660.0 MiB/s")
    assert "waited for data 28.0%" in judged["line"] and "6.6x" in judged["line"]


def test_a_met_target_is_not_called_storage_bound():
    """Reads a little under the per-step requirement, hidden by prefetch: the AU target is met."""
    judged = judge(evidence(au_overall=0.95, delivered_mib_per_s=95.0, data_wait_share=0.02))
    assert judged["verdict"] == "met" and judged["au_target_met"] is True and judged["storage_bound"] is False
    assert judged["line"].startswith("AU target met")
    assert not says_storage_bound(judged["storage_line"])


def test_checkpoints_that_cost_more_than_reading_are_the_verdict():
    judged = judge(evidence(delivered_mib_per_s=80.0, data_wait_share=0.05, checkpoint_share=0.6))
    assert judged["verdict"] == "checkpoints" and judged["storage_bound"] is False
    assert "blocked in checkpoint saves 60.0%" in judged["line"]
    assert not says_storage_bound(judged["storage_line"]) and "not what limits this run" in judged["storage_line"]


def test_no_compute_is_io_only_and_judges_no_storage():
    judged = judge(evidence(au_overall=0.0, required_mib_per_s=None))
    assert judged["verdict"] == "no_compute" and judged["storage_bound"] is None and judged["au_target_met"] is False
    assert judged["line"].startswith("I/O only") and judged["storage_line"].startswith("cannot judge")


def test_borderline_storage_only_when_the_storage_was_measured():
    assert judge(evidence(delivered_mib_per_s=105.0))["verdict"] == "storage_borderline"
    cached = judge(evidence(delivered_mib_per_s=105.0, page_cache_risk=True))
    assert cached["verdict"] == "input_pipeline" and cached["storage_bound"] is None


# -- every pair at once, over a grid of evidence --------------------------------------------------

GRID = list(itertools.product(
    (1, MIN_STEPS_TO_JUDGE, 40),  # fewest steps
    (0.0, 0.5, 0.95),  # au_overall (target 0.9)
    (None, 100.0),  # required MiB/s
    (None, 40.0, 105.0, 660.0),  # delivered MiB/s
    (0.02, 0.3),  # waiting for data
    (0.0, 0.05, 0.6),  # blocked in checkpoints
    (False, True),  # page cache risk
))


def test_no_two_lines_disagree_anywhere_on_the_grid():
    """864 combinations of evidence; one test (a failure names its combination)."""
    for case in GRID:
        try:
            lines_agree(*case)
        except AssertionError as exc:
            raise AssertionError(f"lines disagree for (steps, au, required, delivered, wait, ckpt, cache) = {case}") from exc


def lines_agree(steps, au, required, delivered, wait, ckpt, cache):
    judged = judge(Evidence(steps, au, 0.9, required, delivered, wait, ckpt, cache))
    lines = {"verdict": judged["line"], "storage": judged["storage_line"], "au": judged["au_verdict_reason"]}
    # AU target row <-> verdict row
    too_few = steps < MIN_STEPS_TO_JUDGE
    assert (judged["au_verdict"] == "too few steps to judge") is too_few is (judged["au_target_met"] is None)
    assert lines["verdict"].startswith("too few steps to judge") is too_few
    if judged["au_target_met"] is True:
        assert lines["verdict"].startswith("AU target met") and "NOT met" not in lines["verdict"]
    if judged["au_target_met"] is False:
        assert "met" not in lines["verdict"].replace("NOT met", "").replace("cannot be met", "")
    # storage row <-> verdict row <-> storage_bound
    bound = judged["storage_bound"]
    assert (bound is True) is (judged["verdict"] == "storage")
    assert says_storage_bound(lines["storage"]) is (bound is True)
    assert says_storage_bound(lines["verdict"]) is (bound is True)
    if too_few or cache or required is None or delivered is None:
        assert bound is None and "not storage-bound" not in lines["storage"]
    # one figure for waiting for data: the verdict quotes the time row's share
    if "waiting for data" in lines["verdict"] or "waited for data" in lines["verdict"]:
        assert f"{wait:.1%}" in lines["verdict"]
    # the page cache is named wherever it is part of the verdict, and nowhere else
    if cache and not too_few and required is not None and delivered is not None:
        assert "page cache" in lines["storage"]
    if not cache:
        assert "page cache" not in lines["verdict"] + lines["storage"]
    # the reader and the storage are never both blamed
    assert not (bound and "input pipeline" in lines["verdict"])


# -- the printed table, built from summary.json's train section ----------------------------------

def rank(steps=20, wall=10.0, compute=2.0, wait=7.9, checkpoint=0.0, read_s=0.5):
    return {"epochs": 2, "steps": steps, "samples": steps * 4, "payload_bytes": 0, "compute_s": compute,
            "data_wait_s": wait, "train_wall_s": wall, "au_compute_s": compute * 0.9, "au_wall_s": wall * 0.9,
            "au_blocks": 2, "au_block_steps": steps, "checkpoint_s": checkpoint,
            "io": {"train": {"bytes_read": 64 << 20, "read_s": read_s, "reads": 10}}}


@pytest.mark.parametrize("cache", [False, True])
def test_the_table_prints_the_one_verdict_on_every_line(cache):
    config = load_config(["workload=unet3d", "scale=tiny", "train.computation_time=0.1"])
    train = summaries.train_section([rank(read_s=1.9), rank(read_s=1.9)], config, page_cache_risk=cache)
    rows = dict(report.headline_rows({"workload": "unet3d", "mode": "train", "world_size": 2, "run_dir": "/r", "train": train}))
    assert rows["verdict"] == train["run_verdict"]["line"]
    assert rows["storage"] == train["storage"]["verdict"]
    assert rows["AU target"].startswith("0.90: NOT met: au_overall 0.200 < 0.90")
    assert rows["AU"].startswith("0.200 over the whole run (au_overall, the one judged); DLIO's block AU 0.200")
    assert rows["AU"].endswith("the AU of the [METRIC] lines")  # no metric section given: no DLIO verdict named
    assert rows["time"].endswith("of the training wall time, all ranks together")
    # 128 MiB in 1.9 s = 67.4 MiB/s delivered; 2 ranks x batch 4 x (128 MiB / 160 samples) / 0.1 s = 64 MiB/s needed
    assert train["storage"]["required_mib_per_s"] == pytest.approx(64.0)
    assert train["storage"]["delivered_over_required"] == pytest.approx(2 / 1.9)
    expected = "input_pipeline" if cache else "storage_borderline"
    assert train["run_verdict"]["verdict"] == expected
    assert train["storage"]["storage_bound"] is (None if cache else False)


# -- end to end: the printed table against summary.json -----------------------------------------

def table_rows(stdout: str) -> dict[str, list[str]]:
    """The plain table's rows (key: values in order); [METRIC] lines are not rows."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if "  " not in line or line.startswith(("[METRIC]", "Averaged")):
            continue
        key, value = line.split("  ", 1)
        rows.setdefault(key.strip(), []).append(value.strip())
    return rows


def check_consistent(stdout: str, summary: dict) -> None:
    train, rows = summary["train"], table_rows(stdout)
    assert rows["verdict"] == [train["run_verdict"]["line"]]  # one verdict, printed once
    assert rows["storage"] == [train["storage"]["verdict"]]
    assert train["au_verdict"] in rows["AU target"][0].replace("NOT met", "not met")
    # DLIO's own pass/fail of the [METRIC] lines is named in the AU row as DLIO's, on DLIO's block AU
    expectation = summary["metric"]["train_au_meet_expectation"]
    assert rows["AU"][0].endswith(f"whose train_au_meet_expectation ({expectation}) judges it as DLIO does")
    assert f"[METRIC] train_au_meet_expectation: {expectation}" in stdout
    text = "\n".join(line for line in stdout.splitlines() if not line.startswith("[METRIC]"))
    assert says_storage_bound(text) is (train["storage"]["storage_bound"] is True)
    assert "page cache and the verdict" not in text  # the verdict holds the page cache now
    if train["au_target_met"] is None:
        assert "storage-bound" not in text.replace("not storage-bound", "") and "input pipeline" not in text
    # the time row and the goodput row count different things and say which
    assert "all ranks together" in rows["time"][0] and "steps' time outside compute" in rows["goodput"][0]
    assert rows["goodput"][0].count("waiting for data") == 1


def test_a_tiny_run_prints_one_verdict_that_matches_its_summary(workdir):
    run = workdir / "run"
    done = run_cli(["workload=resnet", "scale=tiny", "progress=false", f"storage.root={workdir / 'store'}",
                    f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    summary = load_summary(run)
    check_consistent(done.stdout, summary)
    assert summary["dataset"]["page_cache_risk"] is True and summary["train"]["storage"]["storage_bound"] is None
    assert summary["train"]["run_verdict"]["verdict"] in ("met", "reader", "input_pipeline", "other")


def test_a_two_step_run_judges_nothing(workdir):
    run = workdir / "run"
    done = run_cli(["workload=unet3d", "scale=tiny", "progress=false", "train.total_steps=2", "train.step_counting=global",
                    "checkpoint.enabled=false", f"storage.root={workdir / 'store'}", f"hydra.run.dir={run}"], workdir / "cwd")
    assert done.returncode == 0, done.stderr
    summary = load_summary(run)
    check_consistent(done.stdout, summary)
    train = summary["train"]
    assert train["steps"] == 2 and train["run_verdict"]["verdict"] == "too_few_steps"
    assert table_rows(done.stdout)["storage"][0].startswith("not judged (too few steps)")
    assert json.dumps(train["run_verdict"]).count("too few steps") == 1
