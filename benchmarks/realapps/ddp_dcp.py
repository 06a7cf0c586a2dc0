"""The same CNN trained data-parallel under torchrun, checkpointed with torch.distributed.checkpoint.

Written after PyTorch's "Getting Started with Distributed Checkpoint (DCP)" and DDP tutorials:
`torchrun --standalone --nproc-per-node 2 ddp_dcp.py ...` starts the processes (env:// rendezvous
on 127.0.0.1, gloo backend, CPU), a DistributedSampler gives each rank its share of the npz files,
DistributedDataParallel averages the gradients, and once per epoch every rank calls
`dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=...)`, the tutorial's Stateful wrapper
around `get_state_dict`. DCP's default planner writes each replicated tensor once, on one rank
(`__<rank>_0.distcp` files), and the coordinator writes `.metadata`.

A reference program, not part of dlio_ckpt; its emulation is ddp_dcp.yaml (fidelity.py).
Rank 0 writes the timings of the slowest rank as JSON (--metrics).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from loop_clock import LoopClock, report
from pytorch_cnn import NpzFolder, SmallResNet, train_step


class AppState(Stateful):
    """The DCP tutorial's wrapper: DCP calls state_dict() when saving, load_state_dict() when loading."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict}

    def load_state_dict(self, state_dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True)
    p.add_argument("--checkpoints", required=True, help="folder for epoch_<n>/ DCP checkpoints")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--workers", type=int, default=1, help="DataLoader worker processes per rank")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--side", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", default="")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dataset = NpzFolder(args.data, args.side, 10)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers)
    model = DDP(SmallResNet(args.width))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    dist.barrier()
    clock = LoopClock()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for images, target in clock.batches(loader):
            train_step(model, criterion, optimizer, images, target)
        with clock.save():
            dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=os.path.join(args.checkpoints, f"epoch_{epoch + 1}"))
    mine = clock.figures()
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        report({"program": "ddp_dcp", "ranks": len(everyone), "steps": mine["steps"],
                "samples": len(dataset) * args.epochs,
                **{key: max(r[key] for r in everyone)
                   for key in ("wall_s", "data_wait_s", "compute_s", "compute_s_per_step")},
                "first_wait_s": min(r["first_wait_s"] for r in everyone),
                **{key: [max(r[key][i] for r in everyone) for i in range(args.epochs)]
                   for key in ("checkpoint_s", "checkpoint_cpu_s", "last_waits_s")}},
               args.metrics)
    dist.barrier()  # every rank is done with the group before any tears it down (the tutorials' cleanup)
    # torch 2.13 + gloo can deadlock at teardown: the main thread, holding the GIL, joins gloo's
    # run-loop thread (~ProcessGroupGloo, when DDP's Reducer drops the group), while that thread
    # waits for the GIL to free the Python tensors of the work it just finished (seen with gdb,
    # about one run in five). A moment's pause lets it finish first.
    time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
