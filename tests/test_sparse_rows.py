"""Row-sparse updates and the Merkle leaf chosen from them (issue 23): an embedding table whose
rows change sparsely is checkpointed incrementally within 2x of the ideal (the changed rows'
bytes plus their metadata) at the default leaf, measured on the bytes that reach disk."""

from __future__ import annotations

import numpy as np
import pytest

from ckpt_util import data_files, make_ctx
from dlio_ckpt.checkpoint.factory import make_checkpoint_engine
from dlio_ckpt.checkpoint.report import checkpoint_summary
from dlio_ckpt.codec.incremental import choose_leaf_bytes
from dlio_ckpt.config.load import load_config
from dlio_ckpt.errors import ConfigError

ROW = 256
TABLE = ["model.model_size_bytes=1MiB", "model.optimization_groups=[]", "checkpoint.update=sparse",
         f"checkpoint.update_chunk_bytes={ROW}", "checkpoint.update_fraction=0.01", "checkpoint.encoding=incremental",
         "checkpoint.keep_last=0"]


def test_the_default_leaf_is_the_row_under_sparse_and_64_kib_otherwise():
    assert load_config([]).checkpoint.incremental.chunk_bytes == 0  # 0: chosen from checkpoint.update
    assert choose_leaf_bytes(0, "sparse", 256) == 256
    assert choose_leaf_bytes(0, "sparse", 64) == 256  # never below 256 B: a leaf's digest and node cost 32 B
    assert choose_leaf_bytes(0, "sparse", 1 << 20) == 1 << 20
    assert choose_leaf_bytes(0, "sgd", 256) == choose_leaf_bytes(0, "random", 256) == 64 << 10
    assert choose_leaf_bytes(4096, "sparse", 256) == 4096  # a configured leaf wins
    with pytest.raises(ConfigError, match="chunk_bytes"):
        load_config(["checkpoint.incremental.chunk_bytes=32"])


def rows_of(folder) -> np.ndarray:
    (data,) = data_files(folder)
    return np.frombuffer(data.read_bytes(), np.uint8)


@pytest.mark.parametrize("leaf,within", [("0", 2.0), ("64KiB", None)])
def test_row_sparse_incremental_writes_within_2x_of_the_changed_rows_at_the_default_leaf(tmp_path, leaf, within):
    ctx = make_ctx(tmp_path, TABLE + [f"checkpoint.incremental.chunk_bytes={leaf}"])
    engine = make_checkpoint_engine(ctx)
    states = []
    for step in (1, 2, 3, 4):
        engine.save(step, 1)
        states.append(b"".join(bytes(p) for pf in engine.plan.files_by_rank[0]
                               for p in engine.state.view(pf).stream(1 << 20)))
    engine.finish()
    rows = checkpoint_summary([[r.as_dict() for r in engine.records]], [None], 1.0, ctx.config)["per_checkpoint"]
    assert rows[0]["codec"]["leaf_bytes"] == (ROW if leaf == "0" else 64 << 10)
    for before, after, row in zip(states, states[1:], rows[1:]):
        changed = int(np.any(np.frombuffer(before, np.uint8).reshape(-1, ROW) != np.frombuffer(after, np.uint8).reshape(-1, ROW), axis=1).sum())
        total_rows = len(after) // ROW
        assert 0.003 * total_rows < changed < 0.02 * total_rows  # about 1 % of the rows changed in one step
        ideal = changed * (ROW + 8) + 32  # the rows, an 8-byte index each, a header
        if within:
            assert row["bytes_written"] <= within * ideal + 4096, (row["bytes_written"], ideal)  # + the manifest
        else:
            assert row["bytes_written"] > 10 * ideal  # a 64 KiB leaf around every changed row: the 1.1x
    restored = engine.restore()
    assert restored.verified and restored.chain_length == 4
