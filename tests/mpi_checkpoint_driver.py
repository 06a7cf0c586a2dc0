"""Run one checkpoint strategy under mpirun and print rank 0's findings as JSON.

Usage: mpirun -n 2 python tests/mpi_checkpoint_driver.py ROOT STRATEGY [override ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ckpt_util import make_ctx  # noqa: E402

from dlio_ckpt.checkpoint.factory import make_checkpoint_engine  # noqa: E402
from dlio_ckpt.checkpoint.report import checkpoint_summary  # noqa: E402
from dlio_ckpt.world import World  # noqa: E402


def main() -> None:
    root, strategy, *extra = sys.argv[1:]
    world = World.from_environment()
    run_id = world.bcast("run-mpi" if world.is_root else None)
    ctx = make_ctx(Path(root), [f"checkpoint.strategy={strategy}", "model.parallelism.zero_stage=1", *extra],
                   world=world, run_id=run_id)
    engine = make_checkpoint_engine(ctx)
    for step in (2, 4):
        engine.save(step, 1)
    engine.finish()
    restore = engine.restore()
    records = world.gather([r.as_dict() for r in engine.records])
    restores = world.gather(restore.as_dict() if restore else None)
    traced = world.gather(ctx.recorder.bytes_written.get("checkpoint", 0))
    if world.is_root:
        print(json.dumps({
            "world": world.size,
            "plan_per_rank": engine.plan.per_rank_bytes(),
            "root": engine.root,
            "summary": checkpoint_summary(records, restores, 1.0, ctx.config),
            "records": records,
            "traced_checkpoint_bytes": traced,
        }))


if __name__ == "__main__":
    main()
