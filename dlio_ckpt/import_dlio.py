"""`dlio_ckpt-import-dlio PATH [-o OUT]`: write the dlio_ckpt workload equivalent to a DLIO workload YAML.

The written file runs as `dlio_ckpt workload=OUT` (or from workloads/ or a --config-dir) exactly
as `dlio_ckpt dlio_config=PATH` does; each key carries a comment naming the DLIO key (or DLIO
default) it came from, so the file can be read against DLIO's.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from dlio_ckpt.errors import USAGE_EXIT_CODE, UserError


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="dlio_ckpt-import-dlio",
                                     description="Convert a DLIO benchmark workload YAML into a dlio_ckpt workload YAML.")
    parser.add_argument("path", help="the DLIO workload YAML (e.g. dlio_benchmark/configs/workload/unet3d_h100.yaml)")
    parser.add_argument("-o", "--output", help="where to write the dlio_ckpt workload (default: standard output)")
    args = parser.parse_args(argv)
    from dlio_ckpt.config.dlio_import import import_file, to_yaml

    try:
        result = import_file(args.path)
    except UserError as exc:
        print(f"dlio_ckpt-import-dlio: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    if result.warning():
        print(f"dlio_ckpt-import-dlio: warning: {result.warning()}", file=sys.stderr, flush=True)
    text = to_yaml(result)
    if not args.output:
        sys.stdout.write(text)
        return
    out = Path(args.output)
    if not out.parent.is_dir():
        print(f"dlio_ckpt-import-dlio: error: -o: {out.parent} is not a folder", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE)
    fd, temp = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, out)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


if __name__ == "__main__":
    main()
