"""`dlio_ckpt-describe-model CHECKPOINT [-o OUT]`: print (or write) a workload's `model:` section
describing a saved checkpoint (torch.save .pt, .npz, .safetensors, a PyTorch DCP folder, a
TensorFlow checkpoint prefix or folder), so a user can describe their own program's state
(docs/fidelity.md). Bad input: one line, exit 2, nothing written."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from dlio_ckpt.describe.readers import read_tensors
from dlio_ckpt.describe.section import model_section, to_yaml
from dlio_ckpt.errors import USAGE_EXIT_CODE, UserError
from dlio_ckpt.local_output import write_text_whole

PROG = "dlio_ckpt-describe-model"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("checkpoint", help="a checkpoint file, a DCP folder, or a TensorFlow checkpoint prefix or folder")
    parser.add_argument("--format", default="auto", help="auto (from the name) | torch | npz | safetensors | dcp | tensorflow")
    parser.add_argument("--name", default="", help="model.name (default: the checkpoint's file name)")
    parser.add_argument("-o", "--output", help="write the section here (default: standard output)")
    args = parser.parse_args(argv)

    path = Path(args.checkpoint)
    out = Path(args.output) if args.output else None
    try:
        if out is not None and not out.parent.is_dir():
            raise UserError(f"-o: {out.parent} is not a folder")
        listing = read_tensors(path, args.format)
        if not listing.tensors:
            raise UserError(f"{path}: holds no tensors")
        section = model_section(listing, args.name or path.name.split(".")[0] or "model")
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    text = to_yaml(listing, section, path.stat().st_size if path.is_file() else None)
    if out is None:
        sys.stdout.write(text)
        return
    write_text_whole(out, text)


if __name__ == "__main__":
    main()
