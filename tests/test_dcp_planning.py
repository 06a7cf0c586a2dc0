"""dcp.save's planning exchange, emulated inside the save (DcpTorchFormat.exchange_plans).

The coordinator gathers every rank's pickled local SavePlan, runs torch's own DefaultSavePlanner
global step (dedup over the replicas) and scatters the global plans. A recording world stands in
for MPI: the plans it carries are DCP's objects, and the dedup DCP's planner does on them puts
every tensor and every non-tensor entry (model.extra_state) on the rank the emulation's layout
writes it from.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field

import pytest

from dlio_ckpt.checkpoint.formats import get_format
from dlio_ckpt.config.load import load_config
from dlio_ckpt.plan.checkpoint import build_checkpoint_plan

RANKS = 3


@dataclass
class RecordingWorld:
    """Rank 0 of RANKS: gather returns every rank's local plan (given), scatter records what is sent."""

    plans: list[bytes]
    rank: int = 0
    size: int = RANKS
    scattered: list = field(default_factory=list)

    @property
    def is_root(self) -> bool:
        return True

    def gather(self, value):
        assert pickle.loads(value).items == pickle.loads(self.plans[0]).items  # rank 0's own plan
        return self.plans

    def scatter(self, values):
        self.scattered.append(values)
        return values[0]


def test_the_plans_exchanged_are_dcps_and_its_dedup_agrees_with_the_layout():
    pytest.importorskip("torch")
    config = load_config(["checkpoint.enabled=true", "checkpoint.layout=pytorch_dcp", "checkpoint.format=torch",
                          "model.kind=explicit", "model.model_size_bytes=3000", "model.layer_parameters=[900,2000,300,4000]",
                          "model.optimization_groups=[700,5000]",
                          "model.extra_state=[{name: lr, value: 0.1},{name: params, value: [a, b]}]"])
    plan = build_checkpoint_plan(config, RANKS)
    fmt = get_format("torch", "pytorch_dcp")
    held = [plan.layout.held_tensors(plan.model, rank) for rank in range(RANKS)]
    local = []
    for rank in range(RANKS):  # each rank's local plan, as the exchange pickles it
        probe = RecordingWorld([b""] * RANKS)
        probe.gather = lambda value, out=local: out.append(value) or [value] * RANKS
        fmt.exchange_plans(probe, held[rank])
    world = RecordingWorld(local)
    fmt.exchange_plans(world, held[0])
    (sent,) = world.scattered
    global_plans = [pickle.loads(data) for data in sent]
    assert [p.storage_data.prefix for p in global_plans] == [f"__{r}_" for r in range(RANKS)]
    kept = [sorted(item.index.fqn for item in p.items) for p in global_plans]
    ours = [sorted(t.name for pf in plan.files_by_rank[rank] for t in pf.tensors) for rank in range(RANKS)]
    assert ours == kept
    assert {"lr", "params"} <= {name for names in ours for name in names}  # the bytes items, placed as DCP places them
    assert sum(len(names) for names in kept) == len(held[0])  # every entry once
