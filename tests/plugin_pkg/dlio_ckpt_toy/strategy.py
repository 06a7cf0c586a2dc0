"""`checkpoint.strategy=toy_receipts`: sharded writes, then each rank leaves a receipt beside the
checkpoint, `receipt-<rank>.txt`: how many files and bytes it wrote."""

from __future__ import annotations

import os

from dlio_ckpt.checkpoint.strategies import ShardedStrategy


class ReceiptStrategy(ShardedStrategy):
    name = "toy_receipts"
    gathers_to_one_writer = False
    persists_in_background = False

    def write(self, index, step):
        entries = super().write(index, step)
        e = self.engine
        folder = os.path.join(e.root, e.layout.folder(step))
        text = f"rank {e.world.rank} wrote {len(entries)} files, {sum(x.bytes_written for x in entries)} bytes\n"
        e.storage.write_atomic(os.path.join(folder, f"receipt-{e.world.rank}.txt"), text.encode())
        return entries
