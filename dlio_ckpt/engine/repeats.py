"""run.repeats=N: the same job N times, and the spread of its figures over them.

Storage figures vary from run to run (the same read job gave 1,035 to 9,440 MiB/s on one shared
machine), so IOR (-i), fio (--loops) and MLPerf Storage (the mean of 5 runs) repeat a job. Each
repeat is a whole run in its own folder, `repeat-<i>/` of the run folder, with its own
summary.json (DLIO's `metric` section included, so mlpstorage reads each one as one of its runs),
event files and traces. Between repeats:

- the dataset is kept: the first repeat generates it (unless a matching one exists already) and
  later repeats reuse it through its fingerprint, as DLIO and MLPerf runs reuse a generated
  dataset. Its pages may still be cached (see `dataset.page_cache_risk` and `storage.drop_caches`);
- this run's checkpoint folder is removed before the next repeat starts (outside any timing and
  untraced: it is no I/O of the emulated program), so every repeat writes to an empty folder,
  restores read only that repeat's checkpoints, and N repeats take the disk space of one; the last
  repeat's checkpoints stay, as a single run's do. mode=restore reads an earlier run's folder and
  removes nothing.

The run folder's summary.json is the last repeat's (so every tool reading a run finds the sections
it expects), plus `repeats` (N), `per_repeat` (each repeat's folder and headline figures),
`repeat_figures` (mean, std, min and max of each headline figure over the repeats) and DLIO's
`metric` section over all repeats' checkpoints and runs.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dlio_ckpt.engine.left_on_disk import left_on_disk
from dlio_ckpt.metrics import mlperf
from dlio_ckpt.metrics import summary as summaries
from dlio_ckpt.metrics.report import print_report
from dlio_ckpt.storage import make_backend
from dlio_ckpt.world import World

# The figures compared over repeats: summary.json paths, present when the run produced them.
HEADLINE_FIGURES = (
    ("train", "samples_per_s"),
    ("train", "read_mib_per_s"),
    ("train", "au"),
    ("train", "au_overall"),
    ("train", "dlio_samples_per_s"),
    ("checkpoint", "write_s_max"),
    ("checkpoint", "write_gib_per_s"),
    ("checkpoint", "restore_s_max"),
    ("checkpoint", "restore_gib_per_s"),
    ("checkpoint", "mlperf", "write_throughput_gib_per_s_mean"),
    ("checkpoint", "mlperf", "read_throughput_gib_per_s_mean"),
    ("replay", "replayed", "read_mib_per_s"),
    ("replay", "replayed", "write_mib_per_s"),
    ("latency", "train", "read", "p99_s"),
    ("latency", "checkpoint", "write", "p99_s"),
    ("wall_s",),
)


def figure_name(path: tuple[str, ...]) -> str:
    return ".".join(path)


def _lookup(summary: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = summary
    for key in path:
        if not isinstance(value, dict) or value.get(key) is None:
            return None
        value = value[key]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def headline(summary: dict[str, Any]) -> dict[str, float]:
    """One repeat's headline figures, by dotted name."""
    restored = (summary.get("checkpoint") or {}).get("restore_verified") is not None
    figures = {figure_name(path): _lookup(summary, path) for path in HEADLINE_FIGURES
               if restored or not path[-1].startswith("restore_")}  # no restore: no restore figures (not 0)
    return {name: value for name, value in figures.items() if value is not None}


def spread(values: list[float]) -> dict[str, Any]:
    """Mean, population std (numpy's default, as DLIO and MLPerf's tools use), min and max."""
    array = np.asarray(values, dtype=np.float64)
    return {"mean": float(array.mean()), "std": float(array.std()), "min": float(array.min()),
            "max": float(array.max()), "each": [float(v) for v in array]}


def combine(runs: list[dict[str, Any]], run_dir: Path, record_length_bytes: int) -> dict[str, Any]:
    """The run folder's summary from the repeats' (rank 0)."""
    combined = copy.deepcopy(runs[-1])
    per_repeat = [{"repeat": i + 1, "run_dir": run["run_dir"], **headline(run)} for i, run in enumerate(runs)]
    names = [name for name in headline(runs[-1]) if all(name in row for row in per_repeat)]
    combined.update({
        "run_dir": str(run_dir),
        "wall_s": sum(run["wall_s"] for run in runs),
        "repeats": len(runs),
        "repeat_shown": f"the sections other than repeats, per_repeat, repeat_figures and metric are repeat {len(runs)}'s "
                        f"(repeat-{len(runs)}/summary.json); each repeat's summary is in its repeat-<i>/ folder",
        "per_repeat": per_repeat,
        "repeat_figures": {name: spread([row[name] for row in per_repeat]) for name in names},
        "metric": mlperf.dlio_metric(runs, record_length_bytes),
    })
    generated = next((run["created"]["dataset"] for run in runs if (run.get("created") or {}).get("dataset")), None)
    if generated:
        combined["created"]["dataset"] = generated  # the first repeat generated it; later ones reused it
    return combined


def repeat_rows(combined: dict[str, Any]) -> list[tuple[str, str]]:
    """The printed rows: each headline figure's mean (std) and min..max over the repeats."""
    count = combined["repeats"]
    rows = [("repeats", f"{count} runs of the job: the rows above are repeat {count}'s (repeat-{count}/summary.json), "
                        f"the rows below mean (std) and min..max over the {count}")]
    for name, figure in combined["repeat_figures"].items():
        if name == "wall_s":
            continue
        rows.append((name, f"{figure['mean']:.4g} ({figure['std']:.3g}), min..max {figure['min']:.4g}..{figure['max']:.4g} "
                           f"over {combined['repeats']} repeats"))
    return rows


def _remove_checkpoints(config: Any, run_id: str) -> None:
    """This run's checkpoint folder, through the storage backend without tracing (no emulated I/O)."""
    if config.mode == "restore":
        return

    folder = os.path.abspath(os.path.join(config.storage.root, config.checkpoint.folder, run_id))
    backend = make_backend(config.storage)
    if backend.exists(folder) or backend.isdir(folder):
        backend.remove_tree(folder)


def _prepare(folder: Path, config: Any, run_id: str, index: int) -> None:
    """Rank 0, before repeat `index`: its folder, and the previous repeat's checkpoints gone."""
    folder.mkdir()
    if index > 1:
        _remove_checkpoints(config, run_id)


def run_repeats(world: World, config: Any, run_dir: Path, run_id: str,
                run_once: Callable[[Path, bool], dict[str, Any] | None]) -> dict[str, Any] | None:
    """Run the job config.run.repeats times, each in run_dir/repeat-<i>; the combined summary on rank 0."""
    runs = []
    count = config.run.repeats
    for index in range(1, count + 1):
        folder = run_dir / f"repeat-{index}"
        world.root_first(lambda: _prepare(folder, config, run_id, index))
        summary = run_once(folder, False)
        if world.is_root:
            assert summary is not None
            runs.append(summary)
            figures = ", ".join(f"{name} {value:.4g}" for name, value in headline(summary).items() if name != "wall_s")
            print(f"repeat {index}/{count}: {figures}", flush=True)
    if not world.is_root:
        return None
    combined = combine(runs, run_dir, config.dataset.record_length_bytes)

    combined["left_on_disk"] = left_on_disk(config, combined["created"], combined.get("dataset"), run_dir)  # all repeats'
    summaries.write_summary(run_dir, combined)
    print_report(combined, config.progress, extra_rows=repeat_rows(combined))
    sys.stdout.flush()
    return combined

