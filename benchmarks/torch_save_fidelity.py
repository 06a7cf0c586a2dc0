"""torch.save against dlio_ckpt's `torch` format (checkpoint.durability=framework), same tensors.

The state is a ResNet-18 training checkpoint as a PyTorch loop saves it: the model's state dict
(weights, BatchNorm buffers and counters) plus SGD's momentum buffer for every weight, each
tensor with its real shape flattened (the emulation saves flat tensors; the bytes per record are
the same). Both sides save the same tensors into a file named `archive.pt` (torch names a
stream's archive `archive/`, a path's after the file, so the bytes are then identical).

Alternating A, B, A, B, ... in one process (`--repeats` pairs), each side reports:
- calls: write system calls (write, writev, pwrite) from the kernel's per-thread counter
  (/proc/thread-self/io `syscw`) and the bytes they moved (`wchar`); fsync and rename counts
  from strace -f -c of one save each, in a child process, where strace is installed;
- time per save: torch.save(state, path) from open to close, against dlio_ckpt's write_s (its
  open to its last write, as summary.json reports it) and the same plus the close (the tracer's
  close event). The emulator assembling the tensors beforehand (`prepare_s`) and freeing them
  afterwards is in neither: a program holds its tensors before and after its save.
Medians and the ratio of medians; nothing is asserted (the tests check the counts exactly).

    .venv/bin/python benchmarks/torch_save_fidelity.py --repeats 9 [--root /scratch/dir]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from _common import environment, git_commit, median, ratio, write_json  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "torch_save_fidelity.json"


def resnet18_tensors() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype) of torchvision's resnet18 state dict, in its order."""
    out: list[tuple[str, tuple[int, ...], str]] = []

    def bn(prefix: str, c: int) -> None:
        out.extend([(f"{prefix}.weight", (c,), "float32"), (f"{prefix}.bias", (c,), "float32"),
                    (f"{prefix}.running_mean", (c,), "float32"), (f"{prefix}.running_var", (c,), "float32"),
                    (f"{prefix}.num_batches_tracked", (), "int64")])

    out.append(("conv1.weight", (64, 3, 7, 7), "float32"))
    bn("bn1", 64)
    cin = 64
    for layer, cout in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            p = f"layer{layer}.{block}"
            first_in = cin if block == 0 else cout
            out.append((f"{p}.conv1.weight", (cout, first_in, 3, 3), "float32"))
            bn(f"{p}.bn1", cout)
            out.append((f"{p}.conv2.weight", (cout, cout, 3, 3), "float32"))
            bn(f"{p}.bn2", cout)
            if block == 0 and layer > 1:
                out.append((f"{p}.downsample.0.weight", (cout, cin, 1, 1), "float32"))
                bn(f"{p}.downsample.1", cout)
        cin = cout
    out += [("fc.weight", (1000, 512), "float32"), ("fc.bias", (1000,), "float32")]
    return out


def checkpoint_arrays() -> dict[str, np.ndarray]:
    """Model state dict + SGD momentum of every trainable weight, flat, seeded contents."""
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {}
    model = resnet18_tensors()
    for name, shape, dtype in model:
        count = int(np.prod(shape)) if shape else 1
        arrays[f"model.{name}"] = rng.standard_normal(count).astype(dtype) if dtype == "float32" else np.zeros(count, dtype)
    for name, shape, dtype in model:
        if dtype == "float32" and "running" not in name:
            arrays[f"optimizer.momentum.{name}"] = rng.standard_normal(int(np.prod(shape))).astype(np.float32)
    return arrays


def thread_io() -> dict[str, int]:
    text = Path("/proc/thread-self/io").read_text()
    return {key: int(value) for key, value in (line.split(": ") for line in text.splitlines())}


def real_save(torch, state: dict, path: str) -> tuple[float, int, int]:
    before = thread_io()
    start = time.perf_counter()
    torch.save(state, path)
    seconds = time.perf_counter() - start
    after = thread_io()
    return seconds, after["syscw"] - before["syscw"], after["wchar"] - before["wchar"]


def emulated_save(storage, path: str, tensors, fmt, chunks) -> tuple[float, float, int, int, float]:
    from dlio_ckpt.checkpoint.fileio import write_file

    before = thread_io()
    done = write_file(storage, path, tensors, fmt, chunks, fsync=False, checksum="none", chunk_bytes=4 << 20)
    after = thread_io()
    close = storage.recorder.array()[-1]  # the file's close, as the tracer timed it
    with_close = done.write_s + float(close["end"] - close["start"])
    return done.write_s, with_close, after["syscw"] - before["syscw"], after["wchar"] - before["wchar"], \
        1 - done.write_calls_s / done.write_s


def real_dcp_save(torch, state: dict, folder: Path) -> tuple[float, int, int]:
    """torch.distributed.checkpoint.save in one process (FileSystemWriter's defaults)."""
    import torch.distributed.checkpoint as dcp

    shutil.rmtree(folder, ignore_errors=True)
    before = thread_io()
    start = time.perf_counter()
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(folder)))
    seconds = time.perf_counter() - start
    after = thread_io()
    return seconds, after["syscw"] - before["syscw"], after["wchar"] - before["wchar"]


def emulated_dcp_save(storage, folder: Path, tensors, fmt, chunks) -> tuple[float, float, int, int, float]:
    """The pytorch_dcp layout's calls for one rank: its `.distcp` (fsynced), then the coordinator's
    `.metadata` (pickled from the rank's records) through `.tmp`, fsync, rename. Returns the
    data file's write_s, the whole save's time (write_s, close, metadata), calls, bytes, share."""
    from dlio_ckpt.checkpoint.fileio import write_file, write_framework_metadata

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    data = str(folder / "__0_0.distcp")
    before = thread_io()
    done = write_file(storage, data, tensors, fmt, chunks, fsync=True, checksum="none", chunk_bytes=4 << 20)
    close = storage.recorder.array()[-1]
    start = time.perf_counter()
    content = fmt.coordinator_content([{"path": "__0_0.distcp", "records": done.records}], {"__0_0.distcp": tensors},
                                      str(folder))
    write_framework_metadata(storage, str(folder / ".metadata"), content, "renamed_fsync")
    metadata_s = time.perf_counter() - start
    after = thread_io()
    total = done.write_s + float(close["end"] - close["start"]) + metadata_s
    return done.write_s, total, after["syscw"] - before["syscw"], after["wchar"] - before["wchar"], \
        1 - (done.write_calls_s + done.fsync_s) / done.write_s


def strace_counts(kind: str, folder: Path, extra: list[str] | None = None) -> dict[str, int] | None:
    """fsync, rename and write-call counts of one save in a child process under strace -f -c."""
    if shutil.which("strace") is None:
        return None
    out = folder / f"strace-{kind}.txt"
    subprocess.run(["strace", "-f", "-c", "-o", str(out), "-e", "trace=write,writev,pwrite64,pwritev,fsync,fdatasync,"
                    "rename,renameat,renameat2", sys.executable, __file__, "--one", kind, "--root", str(folder),
                    *(extra or [])], check=True, capture_output=True)
    counts = {}
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[-1] in ("write", "writev", "pwrite64", "pwritev", "fsync", "fdatasync", "rename",
                                              "renameat", "renameat2") and parts[3].isdigit():
            counts[parts[-1]] = int(parts[3])
    return counts


def setup(root: Path):
    import torch

    from dlio_ckpt.checkpoint.formats import get_format
    from dlio_ckpt.plan.model import TensorSpec
    from dlio_ckpt.storage.events import EventRecorder, JobClock
    from dlio_ckpt.storage.posix import PosixStorage
    from dlio_ckpt.storage.traced import TracedStorage

    arrays = checkpoint_arrays()
    state = {name: torch.from_numpy(a) for name, a in arrays.items()}
    # the BatchNorm counters are int64 (model.layer_dtypes in a workload); the rest float32
    tensors = tuple(TensorSpec(name, a.size, a.itemsize, "model", str(a.dtype)) for name, a in arrays.items())
    views = {name: memoryview(a.view(np.uint8)) for name, a in arrays.items()}
    storage = TracedStorage(PosixStorage(), EventRecorder(rank=0, clock=JobClock.start()))
    for side in ("real", "emulated"):
        (root / side).mkdir(parents=True, exist_ok=True)
    return torch, state, tensors, lambda t: iter([views[t.name]]), get_format("torch"), storage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--root", default="", help="folder for the checkpoints (default: a temporary folder)")
    parser.add_argument("--dcp", action="store_true", help="torch.distributed.checkpoint.save against the "
                        "pytorch_dcp layout instead (one rank)")
    parser.add_argument("--one", choices=("real", "emulated"), help=argparse.SUPPRESS)  # one save, for strace
    args = parser.parse_args()
    root = Path(args.root or tempfile.mkdtemp(prefix="torch_save_fidelity-"))
    torch, state, tensors, chunks, fmt, storage = setup(root)
    if args.dcp:
        return compare_dcp(args, root, torch, state, tensors, chunks, storage)
    if args.one:
        if args.one == "real":
            torch.save(state, str(root / "real" / "archive.pt"))
        else:
            emulated_save(storage, str(root / "emulated" / "archive.pt"), tensors, fmt, chunks)
        return
    real_path, emu_path = str(root / "real" / "archive.pt"), str(root / "emulated" / "archive.pt")
    real_save(torch, state, real_path)  # warm both (imports, page cache of the files' blocks)
    emulated_save(storage, emu_path, tensors, fmt, chunks)
    rows = []
    for _ in range(args.repeats):
        r_s, r_calls, r_bytes = real_save(torch, state, real_path)
        e_s, e_wall, e_calls, e_bytes, e_share = emulated_save(storage, emu_path, tensors, fmt, chunks)
        rows.append({"real_s": r_s, "emulated_write_s": e_s, "emulated_with_close_s": e_wall, "real_calls": r_calls,
                     "emulated_calls": e_calls, "real_bytes": r_bytes, "emulated_bytes": e_bytes,
                     "emulated_serialization_share": e_share})
    identical = Path(real_path).read_bytes() == Path(emu_path).read_bytes()
    straced = {kind: strace_counts(kind, root) for kind in ("real", "emulated")}
    real_t, emu_t = median([r["real_s"] for r in rows]), median([r["emulated_write_s"] for r in rows])
    emu_close = median([r["emulated_with_close_s"] for r in rows])
    summary = {
        "commit": git_commit(), "environment": environment(str(root)), "tensors": len(tensors),
        "checkpoint_bytes": os.path.getsize(real_path), "identical_bytes": identical,
        "write_calls": {"real": rows[-1]["real_calls"], "emulated": rows[-1]["emulated_calls"],
                        "ratio": ratio(rows[-1]["emulated_calls"], rows[-1]["real_calls"])},
        "bytes_written": {"real": rows[-1]["real_bytes"], "emulated": rows[-1]["emulated_bytes"]},
        "strace": straced,
        "time_per_save_s": {"real_median": real_t, "emulated_write_s_median": emu_t, "emulated_with_close_median": emu_close,
                            "ratio_write_s": ratio(emu_t, real_t), "ratio_with_close": ratio(emu_close, real_t),
                            "pair_ratios": [ratio(r["emulated_write_s"], r["real_s"]) for r in rows]},
        "serialization_share_median": median([r["emulated_serialization_share"] for r in rows]),
        "rows": rows,
    }
    write_json(RESULTS, summary)
    print(f"{len(tensors)} tensors, {summary['checkpoint_bytes']:,} bytes per save, files identical: {identical}")
    print(f"write calls per save: real {summary['write_calls']['real']}, emulated {summary['write_calls']['emulated']}")
    for kind, counts in straced.items():
        print(f"strace -c {kind}: {counts}")
    print(f"time per save (median of {args.repeats}): real {real_t:.4f} s, emulated write_s {emu_t:.4f} s "
          f"({ratio(emu_t, real_t):.2f}x), with close {emu_close:.4f} s ({ratio(emu_close, real_t):.2f}x)")
    print(f"serialization share (emulated): {summary['serialization_share_median']:.2f}; results in {RESULTS}")
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


def compare_dcp(args, root: Path, torch, state: dict, tensors, chunks, storage) -> None:
    import warnings

    from dlio_ckpt.checkpoint.formats import get_format

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    fmt = get_format("torch", "pytorch_dcp")
    real_dir, emu_dir = root / "real_dcp", root / "emulated_dcp"
    if args.one:
        if args.one == "real":
            real_dcp_save(torch, state, real_dir)
        else:
            emulated_dcp_save(storage, emu_dir, tensors, fmt, chunks)
        return
    real_dcp_save(torch, state, real_dir)
    emulated_dcp_save(storage, emu_dir, tensors, fmt, chunks)
    rows = []
    for _ in range(args.repeats):
        r_s, r_calls, r_bytes = real_dcp_save(torch, state, real_dir)
        e_s, e_total, e_calls, e_bytes, e_share = emulated_dcp_save(storage, emu_dir, tensors, fmt, chunks)
        rows.append({"real_s": r_s, "emulated_data_write_s": e_s, "emulated_s": e_total, "real_calls": r_calls,
                     "emulated_calls": e_calls, "real_bytes": r_bytes, "emulated_bytes": e_bytes,
                     "emulated_serialization_share": e_share})
    identical = (real_dir / "__0_0.distcp").read_bytes() == (emu_dir / "__0_0.distcp").read_bytes()
    straced = {kind: strace_counts(kind, root, ["--dcp"]) for kind in ("real", "emulated")}
    real_t, emu_t = median([r["real_s"] for r in rows]), median([r["emulated_s"] for r in rows])
    summary = {"commit": git_commit(), "environment": environment(str(root)), "tensors": len(tensors),
               "distcp_identical": identical, "metadata_bytes": {"real": (real_dir / ".metadata").stat().st_size,
                                                                 "emulated": (emu_dir / ".metadata").stat().st_size},
               "write_calls": {"real": rows[-1]["real_calls"], "emulated": rows[-1]["emulated_calls"]},
               "bytes_written": {"real": rows[-1]["real_bytes"], "emulated": rows[-1]["emulated_bytes"]},
               "strace": straced,
               "time_per_save_s": {"real_median": real_t, "emulated_median": emu_t, "ratio": ratio(emu_t, real_t),
                                   "pair_ratios": [ratio(r["emulated_s"], r["real_s"]) for r in rows]},
               "serialization_share_median": median([r["emulated_serialization_share"] for r in rows]), "rows": rows}
    write_json(RESULTS.with_name("dcp_save_fidelity.json"), summary)
    print(f"DCP, one rank: {len(tensors)} tensors, .distcp identical: {identical}, .metadata "
          f"{summary['metadata_bytes']['real']} vs {summary['metadata_bytes']['emulated']} bytes")
    print(f"write calls per save: real {summary['write_calls']['real']}, emulated {summary['write_calls']['emulated']}; "
          f"bytes {summary['bytes_written']['real']:,} vs {summary['bytes_written']['emulated']:,}")
    for kind, counts in straced.items():
        print(f"strace -c {kind}: {counts}")
    print(f"time per save (median of {args.repeats}): real {real_t:.4f} s, emulated {emu_t:.4f} s ({ratio(emu_t, real_t):.2f}x)")
    if not args.root:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
