"""Goodput over the two parameters that matter most around the advised configuration.

Why two: a table names one configuration; a map shows how flat the optimum is, which tells a user
how much a mistaken MTBF or interval would cost. Importance is measured, not assumed: each
parameter (the interval, each slower level's `every`, the MTBF) is swept alone through the
simulator with the others held at the advice, and the two with the widest goodput range are mapped.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from dlio_ckpt.advisor.search import EVERY_CHOICES, Candidate, Settings, interval_grid, score
from dlio_ckpt.advisor.simulate import Plan
from dlio_ckpt.optional import require

_MTBF_FACTORS = (0.25, 0.4, 0.63, 1.0, 1.6, 2.5, 4.0)


@dataclass(frozen=True)
class Axis:
    name: str  # "interval_steps", "every:<level>" or "mtbf_s"
    values: tuple[float, ...]


def axes(best: Candidate) -> list[Axis]:
    out = [Axis("interval_steps", tuple(float(k) for k in interval_grid(best.system)))]
    for slot, level in enumerate(best.system.levels[1:], start=1):
        low = best.plan.every[slot - 1] if slot > 1 else 1
        out.append(Axis(f"every:{level.name}", tuple(float(e) for e in EVERY_CHOICES if e >= low)))
    out.append(Axis("mtbf_s", tuple(best.system.mtbf_s * f for f in _MTBF_FACTORS)))
    return out


def moved(best: Candidate, axis: str, value: float) -> Candidate:
    """`best` with one parameter set to `value`."""
    if axis == "interval_steps":
        return replace(best, plan=Plan(int(value), best.plan.every))
    if axis == "mtbf_s":
        return replace(best, system=replace(best.system, mtbf_s=float(value)))
    slot = [lv.name for lv in best.system.levels].index(axis.split(":", 1)[1])
    every = list(best.plan.every)
    every[slot] = int(value)
    for later in range(slot + 1, len(every)):  # keep later levels' intervals multiples of this one
        every[later] = max(every[later], every[slot]) // every[slot] * every[slot]
    return replace(best, plan=Plan(best.plan.interval_steps, tuple(every)))


def importance(best: Candidate, settings: Settings) -> list[tuple[Axis, float]]:
    """Each parameter with the goodput range it spans alone, widest first."""
    trace = settings.trace()
    ranked = []
    for axis in axes(best):
        goodputs = [score(moved(best, axis.name, v), settings, trace).goodput for v in axis.values]
        ranked.append((axis, float(np.ptp(goodputs))))
    return sorted(ranked, key=lambda pair: -pair[1])


def goodput_map(best: Candidate, settings: Settings, x: Axis, y: Axis) -> np.ndarray:
    trace = settings.trace()
    grid = np.zeros((len(y.values), len(x.values)))
    for i, yv in enumerate(y.values):
        for j, xv in enumerate(x.values):
            grid[i, j] = score(moved(moved(best, y.name, yv), x.name, xv), settings, trace).goodput
    return grid


def write_png(best: Candidate, settings: Settings, path: Path) -> dict:
    """The map as a PNG at `path`; returns what was plotted (axes, importance)."""
    require("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = importance(best, settings)
    (x, x_range), (y, y_range) = ranked[0], ranked[1]
    grid = goodput_map(best, settings, x, y)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    image = ax.pcolormesh(np.arange(len(x.values) + 1), np.arange(len(y.values) + 1), grid, cmap="viridis", shading="flat")
    fig.colorbar(image, ax=ax, label="simulated goodput")
    ax.set_xticks(np.arange(len(x.values)) + 0.5, [f"{v:.3g}" for v in x.values], rotation=60, fontsize=7)
    ax.set_yticks(np.arange(len(y.values)) + 0.5, [f"{v:.3g}" for v in y.values], fontsize=7)
    ax.set_xlabel(x.name)
    ax.set_ylabel(y.name)
    ax.set_title(f"goodput around the advice\n{best.describe()}", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # whole or not at all: drawn under a temporary name beside it, renamed over `path` when complete
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            fig.savefig(handle, dpi=110, format="png")
        os.chmod(temp, 0o644)  # as an ordinary new file (mkstemp's are private)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise
    finally:
        plt.close(fig)
    return {"path": str(path), "x": x.name, "y": y.name,
            "importance": {axis.name: spread for axis, spread in ranked}, "x_range": x_range, "y_range": y_range}
