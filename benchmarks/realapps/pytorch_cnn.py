"""A small image classifier trained the way PyTorch's own examples train one.

Written after pytorch/examples' imagenet/main.py (a Dataset, a DataLoader with worker processes,
a loop that times `data_time` and `batch_time`, and `torch.save` of
{"epoch", "state_dict", "optimizer"} once per epoch), with a ResNet-style network small enough
for a CPU (torchvision is not needed). It is a reference program, not part of dlio_ckpt: the
fidelity benchmark (fidelity.py) runs it under strace beside its emulation
(pytorch_cnn.yaml) and compares the I/O each issues.

Samples are the npz files dlio_ckpt generates (dataset.format: npz, one sample per file): "x"
is a (1, 3*H*W) uint8 array, "y" a (1,) int64 label; __getitem__ opens one file with np.load, as a
user's Dataset over .npz files does.

At the end it writes its timings as JSON (--metrics): data wait (the time `next()` on the loader
blocked, as the examples' data_time), compute, checkpoint seconds per save, loop wall time.
"""

from __future__ import annotations

import argparse
import glob
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from loop_clock import LoopClock, report


class NpzFolder(Dataset):
    """One sample per .npz file: a CHW float image in [0, 1] and a class id."""

    def __init__(self, root: str, side: int, classes: int) -> None:
        self.files = sorted(glob.glob(os.path.join(root, "**", "*.npz"), recursive=True))
        if not self.files:
            raise SystemExit(f"no .npz files under {root}")
        self.side, self.classes = side, classes

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        with np.load(self.files[index]) as sample:
            x, y = sample["x"][0], sample["y"][0]
        image = torch.from_numpy(x.reshape(3, self.side, self.side)).float().div_(255.0)
        return image, int(y) % self.classes


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class SmallResNet(nn.Module):
    """ResNet-18's shape with one block per stage: widths w, 2w, 4w, 8w."""

    def __init__(self, width: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        widths = [width, 2 * width, 4 * width, 8 * width]
        blocks, cin = [], width
        for i, w in enumerate(widths):
            blocks.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.layers = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def train_step(model: nn.Module, criterion, optimizer, images, target) -> None:
    """One step of the tutorials' loop: forward, loss, backward, update, and the loss read back."""
    loss = criterion(model(images), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    loss.item()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder of .npz samples (searched recursively)")
    p.add_argument("--checkpoints", required=True, help="folder for checkpoint_<epoch>.pt")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--width", type=int, default=32, help="channels of the first stage (model size)")
    p.add_argument("--side", type=int, default=32, help="image side: record_length_bytes = 3*side*side")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", default="", help="write the timings here as JSON")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    dataset = NpzFolder(args.data, args.side, 10)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    model = SmallResNet(args.width)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    os.makedirs(args.checkpoints, exist_ok=True)

    clock = LoopClock()
    for epoch in range(args.epochs):
        model.train()
        for images, target in clock.batches(loader):
            train_step(model, criterion, optimizer, images, target)
        with clock.save():
            torch.save({"epoch": epoch + 1, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},
                       os.path.join(args.checkpoints, f"checkpoint_{epoch + 1}.pt"))
    report({"program": "pytorch_cnn", "samples": len(dataset) * args.epochs, **clock.figures()}, args.metrics)

if __name__ == "__main__":
    main()
