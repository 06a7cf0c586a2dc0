"""`dlio_ckpt-profile LOGS... [-o workload.yaml] [--data-root PATH] [--checkpoint-root PATH] [--check]
[--batch-size N] [--strace FILE...]`.

From the Darshan logs of a real training program (files or folders: one log of an MPI job, or the
per-process logs of a non-MPI job with its data-loader workers) to a dlio_ckpt workload whose
every value says where it came from. Bad input (no logs, logs of two jobs, a damaged or truncated
log, no dataset in the logs): one line naming the log and the problem, exit 2, nothing written.
A failed --check run: one line, exit 1. See docs/profile.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from dlio_ckpt.errors import RUN_FAILURE_EXIT_CODE, USAGE_EXIT_CODE, OneLineArgumentParser, UserError
from dlio_ckpt.local_output import write_text_whole
from dlio_ckpt.profile.check import CheckFailed, run_check, table
from dlio_ckpt.profile.profile import profile_logs
from dlio_ckpt.profile.render import render
from dlio_ckpt.profile.strace_input import written_bytes

PROG = "dlio_ckpt-profile"


def parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(prog=PROG, description="Build a dlio_ckpt workload from the Darshan logs of a real run.")
    p.add_argument("logs", nargs="+", type=Path, metavar="LOG", help="Darshan log(s) or folder(s) of logs of ONE run")
    p.add_argument("-o", "--output", type=Path, help="write the workload here (default: standard output)")
    p.add_argument("--data-root", default="", help="the dataset's folder (default: inferred from the reads)")
    p.add_argument("--checkpoint-root", default="", help="the checkpoints' folder (default: inferred from names and writes)")
    p.add_argument("--batch-size", type=int, default=None, help="samples per step per rank, when the log cannot show it")
    p.add_argument("--strace", nargs="+", type=Path, default=[], metavar="FILE",
                   help="strace -f -y output of the same run: bytes written to files the log saw opened but not written")
    p.add_argument("--name", default="", help="the workload's name (default: from the output file, else 'profiled')")
    p.add_argument("--check", action="store_true",
                   help="run the workload at the log's rank count and print the log's figures beside the emulation's")
    return p


def expand(paths: list[Path]) -> list[Path]:
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.darshan"))
            if not found:
                raise UserError(f"{path}: a folder without .darshan logs")
            out += found
        elif path.exists():
            out.append(path)
        else:
            raise UserError(f"{path}: no such file or folder")
    return out


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)

    try:
        if args.batch_size is not None and args.batch_size < 1:
            raise UserError(f"--batch-size {args.batch_size}: give a positive number of samples")
        if args.output is not None and not args.output.parent.resolve().is_dir():
            raise UserError(f"-o {args.output}: {args.output.parent} is not a folder")
        logs = expand(args.logs)

        extra = written_bytes([q for p in args.strace for q in (sorted(p.glob("*")) if p.is_dir() else [p])])
        profile = profile_logs(logs, args.data_root, args.checkpoint_root, args.batch_size, extra)
        name = args.name or (args.output.stem if args.output else "profiled")
        text = render(profile, name, " ".join([PROG, *[str(p) for p in args.logs]]))
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(USAGE_EXIT_CODE) from None
    for log, modules in profile.job.partial:
        print(f"{PROG}: warning: {log}: partial ({', '.join(modules)}): darshan-runtime ran out of records; "
              "set DARSHAN_EXCLUDE_DIRS to the Python environment's folders (docs/profile.md)", file=sys.stderr)
    if args.output is None and not args.check:
        sys.stdout.write(text)
    else:
        target = args.output
        if target is None:
            handle, temp_path = tempfile.mkstemp(prefix="profiled-", suffix=".yaml")
            os.close(handle)
            target = Path(temp_path)
        write_text_whole(target, text)
        if args.output is None:
            sys.stdout.write(text)
        else:
            print(f"{PROG}: wrote {args.output} ({len(profile.not_inferred)} value(s) not inferred: "
                  f"{', '.join(v.key for v in profile.not_inferred) or 'none'})", file=sys.stderr)
        if args.check:
            try:
                rows = run_check(profile, target.resolve())
            except CheckFailed as exc:
                print(f"{PROG}: error: --check: {exc}", file=sys.stderr, flush=True)
                raise SystemExit(RUN_FAILURE_EXIT_CODE) from None
            except UserError as exc:
                print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
                raise SystemExit(USAGE_EXIT_CODE) from None
            finally:
                if args.output is None:
                    target.unlink(missing_ok=True)
            print(table(rows))


if __name__ == "__main__":
    main()
