"""A learned stand-in for the simulator: goodput from (configuration, system), then a cheap search.

Why: the simulator scores a configuration in milliseconds, but a full space (intervals x levels x
flush intervals x strategies, for every system one asks about) is thousands of runs. As in Dey et
al. (../shared/docs/checkpoint-techniques.md, "Multi-level checkpointing"), a model trained on
simulator samples ranks the whole space in one batched prediction; the simulator then confirms
only the top few. Two scikit-learn models are trained on the same samples and compared on held-out
ones: gradient-boosted trees (HistGradientBoostingRegressor) and a small neural network
(MLPRegressor on standardised inputs); the better one searches.

The inputs are dimensionless (search.features: times over the MTBF), so a model trained on
systems around the calibrated one also ranks systems it has not seen.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dlio_ckpt.advisor.search import Candidate, Settings, candidates, feature_matrix, score
from dlio_ckpt.advisor.simulate import Level, Outcome, System


def _log_uniform(rng: np.random.Generator, low: float, high: float) -> float:
    return float(math.exp(rng.uniform(math.log(low), math.log(high))))


def random_system(rng: np.random.Generator) -> System:
    """A two-level system (node-local tier, shared tier flushed from it) from wide ranges."""
    local = _log_uniform(rng, 0.2, 30.0)
    shared = _log_uniform(rng, 2.0 * local, 40.0 * local)
    return System(
        step_s=_log_uniform(rng, 0.1, 5.0), mtbf_s=_log_uniform(rng, 1800.0, 86400.0),
        levels=(Level("local", local, 0.0, local * _log_uniform(rng, 0.5, 2.0), "process"),
                Level("shared", shared, shared, shared * _log_uniform(rng, 0.5, 2.0), "node", flushed=True)),
        node_fraction=float(rng.uniform(0.0, 1.0)), downtime_s=_log_uniform(rng, 5.0, 300.0))


def near(system: System, rng: np.random.Generator) -> System:
    """A system around `system`: MTBF within 4x, each cost within 2x, node share within 0.2."""
    def jitter(x: float) -> float:
        return x * _log_uniform(rng, 0.5, 2.0)

    levels = tuple(replace(lv, blocking_s=jitter(lv.blocking_s), flush_s=jitter(lv.flush_s), restore_s=jitter(lv.restore_s))
                   for lv in system.levels)
    return replace(system, mtbf_s=system.mtbf_s * _log_uniform(rng, 0.25, 4.0), levels=levels,
                   node_fraction=float(np.clip(system.node_fraction + rng.uniform(-0.2, 0.2), 0.0, 1.0)),
                   downtime_s=jitter(system.downtime_s) if system.downtime_s > 0 else _log_uniform(rng, 1.0, 60.0))


def samples(systems: list[System], per_system: int, settings: Settings, seed: int,
            with_groups: bool = False) -> tuple[np.ndarray, ...]:
    """`per_system` random candidates of each system, scored in the simulator; with `with_groups`
    also each sample's system number, so that validation can hold out whole systems."""
    rng = np.random.default_rng(seed)
    chosen: list[Candidate] = []
    goodputs: list[float] = []
    groups: list[int] = []
    for number, system in enumerate(systems):
        pool = candidates(system)
        trace = replace(settings, seed=settings.seed + number).trace()
        for index in rng.choice(len(pool), size=min(per_system, len(pool)), replace=False):
            chosen.append(pool[int(index)])
            goodputs.append(score(pool[int(index)], settings, trace).goodput)
            groups.append(number)
    if with_groups:
        return feature_matrix(chosen), np.array(goodputs), np.array(groups)
    return feature_matrix(chosen), np.array(goodputs)


@dataclass
class Surrogate:
    """Both models, their held-out errors, and the one that searches."""

    models: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    chosen: str = ""
    train_s: float = 0.0
    samples: int = 0

    threads: Any = None  # a threadpoolctl controller: found once, its limit is then cheap (~1 ms)

    def predict(self, X: np.ndarray, model: str | None = None) -> np.ndarray:
        from threadpoolctl import ThreadpoolController

        self.threads = self.threads or ThreadpoolController()
        with self.threads.limit(limits=1):  # one core: OpenMP threads on a busy machine cost 0.4 s a call here
            return self.models[model or self.chosen].predict(X)


def train(X: np.ndarray, y: np.ndarray, seed: int = 0, holdout: float = 0.2, groups: np.ndarray | None = None) -> Surrogate:
    """Fit boosted trees and a small MLP on (X, y); compare them on a held-out share: of the
    systems when `groups` (each sample's system) is given, so the error is on systems the models
    never saw (issue 23: a split by sample lets a system's other samples leak into the fit)."""
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), warnings.catch_warnings():  # one core (see Surrogate.predict)
        warnings.simplefilter("ignore", ConvergenceWarning)  # the held-out error says how well it fitted
        return _train(X, y, seed, holdout, groups, HistGradientBoostingRegressor, MLPRegressor, make_pipeline, StandardScaler)


def _train(X: np.ndarray, y: np.ndarray, seed: int, holdout: float, groups: np.ndarray | None, *sk: Any) -> Surrogate:
    HistGradientBoostingRegressor, MLPRegressor, make_pipeline, StandardScaler = sk
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    if groups is None:
        order = rng.permutation(len(y))
        cut = max(1, int(len(y) * holdout))
        test, fit = order[:cut], order[cut:]
    else:
        names = rng.permutation(np.unique(groups))
        held = names[: max(1, int(len(names) * holdout))]
        in_test = np.isin(groups, held)
        test, fit = np.flatnonzero(in_test), np.flatnonzero(~in_test)
    makers = {
        "gradient_boosting": lambda: HistGradientBoostingRegressor(max_iter=200, learning_rate=0.1, random_state=seed),
        "neural_network": lambda: make_pipeline(StandardScaler(), MLPRegressor(
            hidden_layer_sizes=(32, 32), alpha=1e-4, learning_rate_init=3e-3, max_iter=400, tol=1e-5,
            n_iter_no_change=20, random_state=seed)),
    }
    out = Surrogate(samples=len(y))
    for name, make in makers.items():
        model = make().fit(X[fit], y[fit])  # the held-out share is only for the comparison
        residual = model.predict(X[test]) - y[test]
        out.errors[name] = {"mae": float(np.mean(np.abs(residual))),
                            "r2": float(1.0 - np.sum(residual ** 2) / max(np.sum((y[test] - y[test].mean()) ** 2), 1e-12))}
        out.models[name] = model
    out.chosen = min(out.errors, key=lambda name: out.errors[name]["mae"])
    out.train_s = time.perf_counter() - started
    return out


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    outcome: Outcome
    predicted: float
    simulated: int  # configurations run in the simulator
    seconds: float


def search(surrogate: Surrogate, pool: list[Candidate], settings: Settings, top: int = 5,
           model: str | None = None) -> SearchResult:
    """Rank `pool` with the surrogate, confirm the `top` best in the simulator, keep the best."""
    started = time.perf_counter()
    predicted = surrogate.predict(feature_matrix(pool), model)
    shortlist = np.argsort(-predicted)[:top]
    trace = settings.trace()
    outcomes = {int(i): score(pool[int(i)], settings, trace) for i in shortlist}
    winner = max(outcomes, key=lambda i: outcomes[i].goodput)
    return SearchResult(pool[winner], outcomes[winner], float(predicted[winner]), len(outcomes), time.perf_counter() - started)
