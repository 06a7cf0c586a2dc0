"""`dlio_ckpt-import-dlio PATH [-o OUT]`: write the dlio_ckpt workload equivalent to a DLIO workload YAML.

The written file runs as `dlio_ckpt workload=OUT` (or from workloads/ or a --config-dir) exactly
as `dlio_ckpt dlio_config=PATH` does; each key carries a comment naming the DLIO key (or DLIO
default) it came from, so the file can be read against DLIO's.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from dlio_ckpt.config.dlio_import import import_file, to_yaml
from dlio_ckpt.errors import RUN_FAILURE_EXIT_CODE, USAGE_EXIT_CODE, OneLineArgumentParser, UserError
from dlio_ckpt.local_output import write_text_whole
from dlio_ckpt.local_fs import system_folder


def main(argv: Sequence[str] | None = None) -> None:
    parser = OneLineArgumentParser(prog="dlio_ckpt-import-dlio",
                                     description="Convert a DLIO benchmark workload YAML into a dlio_ckpt workload YAML.")
    parser.add_argument("path", help="the DLIO workload YAML (e.g. dlio_benchmark/configs/workload/unet3d_h100.yaml)")
    parser.add_argument("-o", "--output", help="where to write the dlio_ckpt workload (default: standard output)")
    args = parser.parse_args(argv)

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
    refusal = _output_refusal(out)
    if refusal:
        print(f"dlio_ckpt-import-dlio: error: -o: {refusal}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE)
    try:
        write_text_whole(out, text)
    except OSError as exc:  # at run time: a full disk, a folder gone since the check
        print(f"dlio_ckpt-import-dlio: error: -o: {out}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        raise SystemExit(RUN_FAILURE_EXIT_CODE) from None


def _output_refusal(out: Path) -> str:
    """Why `-o OUT` cannot take the workload (checked before anything is written), or "": its
    folder must exist and take a new file (probed: root ignores permission bits, a read-only
    mount does not), and the name must be new or a regular file, outside the kernel's folders,
    since the file is renamed over it (a device such as /dev/null would be replaced)."""
    target = os.path.realpath(os.path.abspath(out))
    if not out.parent.is_dir():
        return f"{out.parent} is not a folder; create it first or choose another path"
    if os.path.lexists(out) and not os.path.isfile(target):
        return f"{out} exists and is not a file; give a new or regular file name"
    kernel = system_folder(target)
    if kernel is not None:
        return f"{out} is under {kernel}, a kernel file system; give a path in a folder of yours"
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in {out.parent} ({exc.strerror}); choose a writable folder"
    return ""


if __name__ == "__main__":
    main()
