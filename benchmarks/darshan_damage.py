"""Damaged Darshan logs against dlio_ckpt-analyze and the replay: tried / clean (issue 24).

Each log (default: the 24 real DLIO logs in ../shared/data/darshan/dlio_logs) gets `--flips`
single-byte changes at seeded random offsets (a random new value) and `--cuts` truncations at
seeded random lengths. Every damaged copy goes to both commands, each in a forked child (so a
crash in libdarshan-util is counted as the child's signal, not the end of this script):

- analyze: `dlio_ckpt-analyze LOG --json --no-plots` (its main(), the console script's code);
- replay: `load_replay_plan(LOG)`, the parse both the loader's check and the run do.

A copy is clean when both commands read it exactly as the original (the same analysis document,
the path aside, and the same replay plan: files, sizes, every call), or both refuse it with
exit 2 and one line naming the log, with no signal and no traceback. Anything else is counted by
kind and listed. `--cli N` also runs `dlio_ckpt workload=replay` on the first N refused copies
and checks exit 2, one stderr line, and nothing written (no storage root, no run folder).

    .venv/bin/python benchmarks/darshan_damage.py --quick          # 3 logs x 40 flips + 5 cuts, ~30 s
    .venv/bin/python benchmarks/darshan_damage.py                  # 24 logs x 200 flips + 10 cuts
    .venv/bin/python benchmarks/darshan_damage.py --logs 0,5,20 --flips 200 --cuts 10 --cli 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOGS = REPO.parent / "shared" / "data" / "darshan" / "dlio_logs"
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import git_commit, tool, write_json  # noqa: E402


def forked(function, folder: str) -> tuple[int, str, str]:
    """(wait status, stdout, stderr) of function() in a forked child; its return value is the exit code."""
    out, err = os.path.join(folder, "out"), os.path.join(folder, "err")
    pid = os.fork()
    if pid == 0:
        code = 97
        try:
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            code = function()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 98
        except BaseException:  # noqa: BLE001 - a traceback is a finding
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status, Path(out).read_text(errors="replace"), Path(err).read_text(errors="replace")


def analysis(path: str) -> int:
    from dlio_ckpt.analysis.cli import main

    return main([path, "--json", "--no-plots"])


def plan(path: str) -> int:
    from dlio_ckpt.errors import ConfigError
    from dlio_ckpt.plan.replay_log import load_replay_plan

    try:
        loaded = load_replay_plan(path)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(json.dumps({"files": [(f.relative, f.size, f.read) for f in loaded.files], "nprocs": loaded.nprocs,
                      "ops": [calls.tolist() for calls in loaded.ops]}))
    return 0


def outcome(result: tuple[int, str, str], reference: str, path: str, prefix: str) -> str:
    status, out, err = result
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    code = os.WEXITSTATUS(status)
    if code == 0:
        return "same" if out.replace(path, "LOG") == reference else "read differently"
    lines = err.strip().splitlines()
    if "Traceback" in err:
        return "traceback"
    if code == 2 and len(lines) == 1 and lines[0].startswith(prefix) and os.path.basename(path) in lines[0]:
        return "refused"
    return f"exit {code}, {len(lines)} lines"


def replay_cli(path: str, folder: Path) -> str:
    """The full command on a refused copy: exit 2, one line, nothing written."""
    (folder / "cwd").mkdir(parents=True, exist_ok=True)
    done = subprocess.run([tool("dlio_ckpt"), "workload=replay", f"replay.log={path}", "progress=false",
                           f"storage.root={folder / 'root'}", f"hydra.run.dir={folder / 'run'}"],
                          cwd=folder / "cwd", capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    written = (folder / "root").exists() or (folder / "run").exists() or any((folder / "cwd").iterdir())
    clean = done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr and not written
    return "clean" if clean else f"exit {done.returncode}, {len(lines)} lines, written={written}"


def damaged_copies(data: bytes, flips: int, cuts: int, rng: random.Random):
    for _ in range(flips):
        offset = rng.randrange(len(data))
        value = rng.randrange(255)
        value += value >= data[offset]  # any value but the original
        changed = bytearray(data)
        changed[offset] = value
        yield f"flip {offset} {data[offset]}->{value}", bytes(changed)
    for _ in range(cuts):
        length = rng.randrange(len(data))
        yield f"cut {length}", data[:length]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", default="all", help="comma-separated indices into the sorted logs, or 'all'")
    parser.add_argument("--flips", type=int, default=200, help="single-byte changes per log")
    parser.add_argument("--cuts", type=int, default=10, help="truncations per log")
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--cli", type=int, default=0, help="full replay commands on this many refused copies")
    parser.add_argument("--quick", action="store_true", help="logs 0,5,20 with 40 flips and 5 cuts each")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "darshan_damage.json"))
    args = parser.parse_args()
    if args.quick:
        args.logs, args.flips, args.cuts = "0,5,20", 40, 5
    import darshan  # noqa: F401 - imported once here, so each forked child starts with it

    import dlio_ckpt.analysis.cli  # noqa: F401
    import dlio_ckpt.plan.replay  # noqa: F401

    logs = sorted(LOGS.glob("*.darshan"))
    chosen = logs if args.logs == "all" else [logs[int(i)] for i in args.logs.split(",")]
    rng = random.Random(args.seed)
    counts: dict[str, int] = {}
    problems: list[dict] = []
    cli_results: dict[str, int] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="darshan-damage-") as scratch:
        for log in chosen:
            data = log.read_bytes()
            reference = forked(lambda: analysis(str(log)), scratch)[1].replace(str(log), "LOG")
            plan_reference = forked(lambda: plan(str(log)), scratch)[1]
            for label, damaged in damaged_copies(data, args.flips, args.cuts, rng):
                path = os.path.join(scratch, log.name)
                Path(path).write_bytes(damaged)
                a = outcome(forked(lambda: analysis(path), scratch), reference, path, "dlio_ckpt-analyze: error:")
                r = outcome(forked(lambda: plan(path), scratch), plan_reference, path, "replay.log:")
                kind = a if a == r and a in ("same", "refused") else f"analyze {a} / replay {r}"
                counts[kind] = counts.get(kind, 0) + 1
                if kind not in ("same", "refused"):
                    problems.append({"log": log.name, "damage": label, "analyze": a, "replay": r})
                elif kind == "refused" and sum(cli_results.values()) < args.cli:
                    result = replay_cli(path, Path(scratch) / f"cli{sum(cli_results.values())}")
                    cli_results[result] = cli_results.get(result, 0) + 1
    tried = sum(counts.values())
    clean = counts.get("same", 0) + counts.get("refused", 0)
    result = {"logs": [p.name for p in chosen], "flips_per_log": args.flips, "cuts_per_log": args.cuts,
              "seed": args.seed, "tried": tried, "clean": clean, "read_as_original": counts.get("same", 0),
              "refused_by_both": counts.get("refused", 0), "counts": counts, "problems": problems[:50],
              "replay_cli": cli_results, "wall_s": round(time.perf_counter() - started, 1), "commit": git_commit()}
    print(f"tried {tried}, clean {clean} (read as the original {result['read_as_original']}, refused by both "
          f"{result['refused_by_both']}); not clean {tried - clean}: "
          f"{ {k: v for k, v in counts.items() if k not in ('same', 'refused')} }")
    if args.cli:
        print(f"replay command on refused copies: {cli_results}")
    write_json(Path(args.out), result)


if __name__ == "__main__":
    main()
