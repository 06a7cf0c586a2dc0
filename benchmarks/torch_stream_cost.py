"""What the `torch` format's stream costs inside a save: torch.save(state, path) against the
format's write through the C TorchStream and through the Python pair it stands for.

torch.save hands its stream every piece of every zip record (five calls a record: ~600 for a
112-tensor state dict); torch.save into a path makes those calls to a C++ std::ofstream, the
emulation to checkpoint/torch_stream.py's stream over the traced file (its records renamed as a
path names them, libstdc++'s buffering, the same system calls). Three sides, alternating in one
process, the same tensors and file name, each save into a new file (the previous one deleted
first, untimed):

- real: torch.save(state, path), open to close;
- c: fileio.write_file with the `torch` format (what the engine times as write_s, plus the close),
  the C TorchStream (`_torch_stream_c`, where built);
- python: the same with `torch_stream._torch_stream_c` set to None (FilebufStream under ArchiveNamed).

The two streams' files are byte for byte the same; torch.save's own differs by ~1 KB in data.pkl
(the pickle of a state assembled here from numpy arrays against the format's), not in its records.
The state is pytorch_cnn's (benchmarks/realapps/pytorch_cnn.yaml: 112 tensors, 9.8 MB, the
reference program whose checkpoint time issue 21 compares), or `--resnet18` (torch_save_fidelity.py's
184 tensors, 93.6 MB). Medians and ratios to real; nothing is asserted (tests/test_torch_stream_c.py
checks that the two streams issue the same calls).

    .venv/bin/python benchmarks/torch_stream_cost.py --repeats 21
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import yaml  # noqa: E402

from _common import environment, git_commit, median, ratio, write_json  # noqa: E402
from torch_save_fidelity import checkpoint_arrays, emulated_save, setup  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "torch_stream_cost.json"


def pytorch_cnn_arrays() -> dict[str, np.ndarray]:
    """pytorch_cnn's checkpoint tensors, by the workload's names, sizes and element types."""
    model = yaml.safe_load((HERE / "realapps" / "pytorch_cnn.yaml").read_text())["model"]
    rng = np.random.default_rng(0)
    arrays = {}
    for name, count, dtype in zip(model["layer_names"], model["layer_parameters"], model["layer_dtypes"]):
        arrays[name] = rng.standard_normal(count).astype(dtype) if dtype == "float32" else np.zeros(count, dtype)
    for name, count in zip(model["optimization_group_names"], model["optimization_groups"]):
        arrays[name] = rng.standard_normal(count).astype(np.float32)
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--resnet18", action="store_true", help="torch_save_fidelity.py's ResNet-18 state instead")
    parser.add_argument("--root", default="", help="folder for the files (default: a temporary folder)")
    args = parser.parse_args()

    import torch

    from dlio_ckpt.checkpoint import torch_stream
    from dlio_ckpt.plan.model import TensorSpec

    if torch_stream._torch_stream_c is None:
        sys.exit("the C extension dlio_ckpt.checkpoint._torch_stream_c is not built (pip install -e . --no-deps)")
    built = torch_stream._torch_stream_c
    root = Path(args.root or tempfile.mkdtemp(prefix="torch_stream_cost-"))
    _, _, _, _, fmt, storage = setup(root)
    arrays = checkpoint_arrays() if args.resnet18 else pytorch_cnn_arrays()
    state: dict = {}  # nested at each `/`, as the format nests a state dict's names (formats.state_path)
    for name, a in arrays.items():
        *outer, last = name.split("/")
        place = state
        for key in outer:
            place = place.setdefault(key, {})
        place[last] = torch.from_numpy(a)
    tensors = tuple(TensorSpec(name, a.size, a.itemsize, "model", str(a.dtype)) for name, a in arrays.items())
    views = {name: memoryview(a.view(np.uint8)) for name, a in arrays.items()}

    def chunks(tensor):
        return iter([views[tensor.name]])

    paths = {side: str(root / side / "checkpoint_1.pt") for side in ("real", "c", "python")}

    def real() -> float:
        start = time.perf_counter()
        torch.save(state, paths["real"])
        return time.perf_counter() - start

    def through(side: str, module) -> float:
        torch_stream._torch_stream_c = module
        try:
            return emulated_save(storage, paths[side], tensors, fmt, chunks)[1]  # write_s plus the close
        finally:
            torch_stream._torch_stream_c = built

    sides = {"real": real, "c": lambda: through("c", built), "python": lambda: through("python", None)}
    for side in ("c", "python"):
        (root / side).mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(args.repeats + 1):  # the first round warms up (imports, allocator), not counted
        order = list(sides) if round_ % 2 else list(reversed(sides))
        for side in order:
            if os.path.exists(paths[side]):
                os.unlink(paths[side])
            seconds = sides[side]()
            if round_:
                times[side].append(seconds)
    sizes = {side: os.path.getsize(path) for side, path in paths.items()}
    same = Path(paths["c"]).read_bytes() == Path(paths["python"]).read_bytes()  # the two streams, byte for byte
    medians = {side: median(values) for side, values in times.items()}
    summary = {"commit": git_commit(), "environment": environment(str(root)), "state": "resnet18" if args.resnet18 else "pytorch_cnn",
               "tensors": len(tensors), "bytes": sizes, "c_and_python_identical": same,
               "median_s": medians, "ratio_to_real": {side: ratio(medians[side], medians["real"]) for side in ("c", "python")},
               "times_s": times}
    write_json(RESULTS, summary)
    print(f"{summary['state']}: {len(tensors)} tensors; bytes a save: " + ", ".join(f"{k} {v:,}" for k, v in sizes.items())
          + f"; the two streams' files identical: {same}")
    for side in sides:
        print(f"  {side:7s} {medians[side] * 1e3:7.2f} ms  ({ratio(medians[side], medians['real']):.2f}x torch.save)")
    print(f"results in {RESULTS}")
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
