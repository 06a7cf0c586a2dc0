"""Multi-level checkpoints under mpirun: five checkpoints, a node failure, a restore; prints rank 0's
findings as JSON (tests/test_levels.py).

Usage: mpirun -n 2 python tests/levels_mpi_driver.py ROOT [override ...]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ckpt_util import make_ctx  # noqa: E402

from dlio_ckpt.checkpoint.factory import make_checkpoint_engine  # noqa: E402
from dlio_ckpt.plan.checkpoint import MANIFEST_NAME  # noqa: E402
from dlio_ckpt.world import World  # noqa: E402


def main() -> None:
    root, *extra = sys.argv[1:]
    world = World.from_environment()
    ctx = make_ctx(Path(root), ["model.parallelism.zero_stage=1", *extra], world=world, run_id="run-mpi")
    engine = make_checkpoint_engine(ctx)
    for step in range(1, 6):
        engine.save(step, 1)
    engine.finish()
    local = engine.engines[0].root
    writers = {}
    if world.is_root:
        for step in range(1, 6):
            manifest = json.loads(Path(local, f"step_{step:08d}", MANIFEST_NAME).read_bytes())
            writers[step] = {os.path.basename(f["path"]): f["writer"] for f in manifest["files"]}
    removed = engine.fail("node", engine.node_of(1))
    restored = engine.restore()
    if world.is_root:
        print(json.dumps({"nodes": engine.nodes, "local_root": local, "writers": writers, "removed": len(removed),
                          "restored": restored.as_dict()}))


if __name__ == "__main__":
    main()
