"""A user's own training trajectory: a folder of saved states (`checkpoint.update=files`).

`checkpoint.update_files=DIR` holds one saved state per step or per checkpoint of a real training
run: `.npy` (one array), `.npz` (named arrays), `.safetensors` (when the package is installed) or
`.pt`/`.pth`/`.bin` (a torch state dict, nested dicts such as {"model": ..., "optimizer": ...}
included). A file's step is the last number in its name (`step_120.pt`, `ckpt-00120.npz`). The
state at step s is the saved state of the largest step <= s (the earliest one before it, the last
one after it). Its float arrays (ints and bools are not parameters) are flattened in the file's
order into one float32 vector; every file must give the same count.

Files are streamed: a state is read when a step needs it, and only the two asked for last are kept
in memory (an update from a to b needs both), never the whole folder.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np

SUFFIXES = (".npy", ".npz", ".safetensors", ".pt", ".pth", ".bin")
_STEP = re.compile(r"(\d+)(?!.*\d)")


def trajectory_steps(folder: str) -> dict[int, Path]:
    """step -> saved state in `folder`; ValueError (one line, what to do) when it holds none or
    two files claim one step."""
    root = Path(folder)
    if not folder or not root.is_dir():
        raise ValueError(f"checkpoint.update_files: {folder!r} is not a folder; give the folder of a training run's "
                         f"saved states ({', '.join(SUFFIXES)}, one per step or checkpoint, the step in each name)")
    steps: dict[int, Path] = {}
    for path in sorted(root.iterdir()):
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        found = _STEP.search(path.stem)
        if found is None:
            raise ValueError(f"checkpoint.update_files: {path.name} has no step number in its name; name each saved "
                             f"state after its training step (e.g. step_{100}{path.suffix})")
        step = int(found.group(1))
        if step in steps:
            raise ValueError(f"checkpoint.update_files: {steps[step].name} and {path.name} are both step {step}; "
                             "keep one state per step")
        steps[step] = path
    if not steps:
        raise ValueError(f"checkpoint.update_files: {folder} holds no saved state ({', '.join(SUFFIXES)}); "
                         "save the training run's states there")
    return dict(sorted(steps.items()))


def _arrays(value: Any) -> Iterator[np.ndarray]:
    """The arrays in a loaded object, depth first in its own order (dicts, lists, tensors)."""
    if isinstance(value, np.ndarray):
        yield value
    elif hasattr(value, "detach") and hasattr(value, "numpy"):  # a torch tensor
        tensor = value.detach().cpu()
        if tensor.is_floating_point():
            yield tensor.float().numpy()
    elif isinstance(value, dict):
        for item in value.values():
            yield from _arrays(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _arrays(item)


def load_state(path: Path) -> np.ndarray:
    """The float values of one saved state, flattened in the file's order, as float32."""
    if path.suffix == ".npy":
        loaded: Any = np.load(path, allow_pickle=False)
    elif path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as archive:
            loaded = {name: archive[name] for name in archive.files}
    elif path.suffix == ".safetensors":
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise ValueError(f"{path.name}: reading .safetensors needs the safetensors package "
                             "(pip install safetensors), or save the states as .npz") from None
        loaded = load_file(str(path))
    else:
        import torch

        loaded = torch.load(path, map_location="cpu", weights_only=True)
    parts = [a.astype(np.float32, copy=False).ravel() for a in _arrays(loaded) if a.dtype.kind == "f"]
    if not parts:
        raise ValueError(f"checkpoint.update_files: {path.name} holds no float arrays")
    return np.concatenate(parts)


class Trajectory:
    """The saved states of a folder, at any training step (the same interface as MlpTrace)."""

    def __init__(self, folder: str) -> None:
        self._files = trajectory_steps(folder)
        self._steps = np.array(list(self._files), dtype=np.int64)
        self._loaded: dict[int, np.ndarray] = {}  # the two saved states read last
        self._size: int | None = None

    @property
    def steps(self) -> list[int]:
        return self._steps.tolist()

    def saved_step(self, step: int) -> int:
        """The step of the saved state that holds at `step`."""
        index = max(0, int(np.searchsorted(self._steps, step, side="right")) - 1)
        return int(self._steps[index])

    def params_at(self, step: int) -> np.ndarray:
        saved = self.saved_step(step)
        params = self._loaded.get(saved)
        if params is None:
            params = load_state(self._files[saved])
            if self._size is None:
                self._size = len(params)
            elif len(params) != self._size:
                raise ValueError(f"checkpoint.update_files: {self._files[saved].name} holds {len(params)} float values, "
                                 f"the earlier states {self._size}; every state must be of the same model")
            while len(self._loaded) >= 2:
                del self._loaded[next(iter(self._loaded))]
            self._loaded[saved] = params
        return params
