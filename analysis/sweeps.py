"""Sweep folders -> one JobAnalysis per job, labelled by what the job changed.

A sweep exists to be compared, so each job keeps its row of sweep_summary.csv (overrides and the
headline metrics the sweep recorded) beside what is recomputed from its run folder. A row whose
folder is gone still appears, with the CSV's figures only, so a partly deleted sweep still compares.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from dlio_ckpt.analysis.inputs import is_run_folder
from dlio_ckpt.analysis.model import JobAnalysis
from dlio_ckpt.analysis.run_folders import analyse_run
from dlio_ckpt.errors import UserError


def _number(text: str) -> Any:
    """CSV cells back to numbers where they are numbers, so the compare table can plot them."""
    if text is None:
        return None
    text = text.strip()
    if text == "":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            continue
    return text


def read_sweep_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    try:
        with open(sweep_dir / "sweep_summary.csv", newline="", encoding="utf-8") as handle:
            rows = [{k: _number(v) for k, v in row.items() if k is not None} for row in csv.DictReader(handle)]
    except (OSError, csv.Error) as exc:
        raise UserError(f"{sweep_dir / 'sweep_summary.csv'}: cannot read the sweep summary ({exc})") from exc
    return rows


def _distinguishing(rows: list[dict[str, Any]]) -> dict[Any, str]:
    """Per job, only the overrides that differ between the jobs: what the sweep varied."""
    split = {row.get("job"): str(row.get("overrides") or "").split() for row in rows}
    common = set.intersection(*(set(v) for v in split.values())) if split else set()
    return {job: " ".join(o for o in overrides if o not in common) for job, overrides in split.items()}


def _job_label(row: dict[str, Any], varied: dict[Any, str] | None = None) -> str:
    overrides = (varied or {}).get(row.get("job"), row.get("overrides"))
    return f"job {row.get('job')}" + (f": {overrides}" if overrides not in (None, "") else "")


def _csv_only(sweep_dir: Path, row: dict[str, Any], varied: dict[Any, str]) -> JobAnalysis:
    headline = {k: v for k, v in row.items() if k not in ("job", "overrides")}
    return JobAnalysis(
        label=_job_label(row, varied), kind="run", inputs=[str(sweep_dir / str(row.get("job")))],
        bytes_read=int(row.get("bytes_read") or 0), bytes_written=int(row.get("bytes_written") or 0),
        per_phase={}, per_rank=[], slowest_rank=None, histogram={}, files={"count": None, "top": []},
        io_time_share={}, job={"sweep": str(sweep_dir), "job": row.get("job")}, headline=headline,
        extra={"sweep_row": row}, warnings=[f"run folder {row.get('job')} missing: figures from sweep_summary.csv"],
    )


def analyse_sweep(sweep_dir: Path, timeline: bool = True) -> list[JobAnalysis]:
    rows = read_sweep_rows(sweep_dir)
    if not rows:
        rows = [{"job": p.name} for p in sorted(sweep_dir.iterdir(), key=lambda p: (len(p.name), p.name)) if is_run_folder(p)]
    varied = _distinguishing(rows)
    jobs = []
    for row in rows:
        folder = sweep_dir / str(row.get("job"))
        if not is_run_folder(folder):
            jobs.append(_csv_only(sweep_dir, row, varied))
            continue
        jobs.append(_sweep_job(sweep_dir, row, varied, timeline))
    return jobs


def analyse_sweep_job(run_dir: Path, timeline: bool = True) -> JobAnalysis | None:
    """A run folder given on its own that is a job of a sweep (`sweep/3`): named `job 3` and
    labelled by what it varied, as when the whole sweep is given; None for any other folder."""
    run_dir = Path(run_dir)
    if not (run_dir.name.isdigit() and (run_dir.parent / "sweep_summary.csv").is_file()):
        return None
    rows = read_sweep_rows(run_dir.parent)
    row = next((r for r in rows if str(r.get("job")) == run_dir.name), None)
    return None if row is None else _sweep_job(run_dir.parent, row, _distinguishing(rows), timeline)


def _sweep_job(sweep_dir: Path, row: dict[str, Any], varied: dict[Any, str], timeline: bool) -> JobAnalysis:
    analysis = analyse_run(sweep_dir / str(row.get("job")), label=_job_label(row, varied), timeline=timeline)
    analysis.extra["sweep_row"] = row
    analysis.job["sweep"] = str(sweep_dir)
    analysis.job["job"] = row.get("job")  # the folder's name, so columns can be named after it
    for key, value in row.items():
        # world_size is the "ranks" row already; job/overrides label the column
        if key not in ("job", "overrides", "world_size") and analysis.headline.get(key) is None:
            analysis.headline[key] = value
    analysis.headline["overrides"] = row.get("overrides")
    return analysis
