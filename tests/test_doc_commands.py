"""Every command in README.md and docs/*.md runs (issue 27, item 7): an example that stops working
fails here, not in a user's hands.

The commands are taken from the fenced shell blocks (```bash, ```sh, ```console or unlabelled) by
running each block in bash with the programs replaced by functions that record their arguments,
so loops, `$((21 * n))`, `$USER` and line continuations expand as a shell expands them. Each
recorded call is then adapted mechanically and run for real:

- storage.root (and absolute dataset, level and checkpoint folders) go into a temporary folder,
  hydra.run.dir / hydra.sweep.dir stay relative to a temporary working folder (or get one there);
- scale=tiny is forced on runs (not on mode=plan, mode=datasize or --cfg, which do no I/O), and
  run.repeats is at most 2; the page cache is dropped only where the command asks, and in README.md's
  MLPerf procedure (DROP_CACHES);
- mpirun / mpiexec -np N runs under `mpirun -n min(N, 2)` only where the rank count matters to what
  the block shows (`mpi_reason`): the document is about scale-out, the command sets a rank-dependent
  key (checkpoint strategy, layout, levels, replicas, model parallelism, world), it shows an error
  line, or the prose around it ties it to its ranks (which keeps one MPI run in every document that
  has mpirun commands); elsewhere the same arguments run serially, one rank forked from the tests'
  forkserver (an MPI start costs ~4 s of CPU more); hostfile and mapping options are dropped;
- `[optional]` arguments of a synopsis are left out, and `dlio_ckpt ...` repeats the arguments of
  the block's previous dlio_ckpt command;
- placeholders become fixtures the test makes: a Darshan log with DXT written by a tiny run
  (`run.darshan`, `real_app.darshan`, `other_system.darshan`, ...), one without (`nodxt.darshan`),
  a DLIO workload YAML (`unet3d_h100.yaml`), a workload file (`/path/to/my.yaml`), run and sweep
  folders (`runs/2026-...`, `multirun/...`, `runs/sync`), and ../shared/data/darshan for the real logs;
- what needs a cluster or a service is checked for composition only (`--cfg job`, or Slurm's
  dry run), with the reason: srun, LD_PRELOAD of darshan-runtime, S3 endpoints.

A command followed in its block by a `PROG: error:` line must exit 2 printing that line (a `...`
in the documented line stands for text that varies); `# exit N` in a comment sets the expected
exit code. Identical adapted commands run once in a block (a repeat that names another run folder
gets a copy of the first run's). One test per block, so blocks run in parallel under xdist; the
fixtures are made once per session (the workers share them). The analysis programs are forked from
the tests' analysis server, which has PyDarshan, pandas and matplotlib imported (cli_fork.ANALYSIS_PRELOAD).
Measured with -n 0 at load ~6: 42 tests, ~175 s wall (the same as before README.md#7's 2-rank run
was found and the serial rule came: MPI starts saved in README.md#1/#3/#6, forked analysis in
analysis.md, checkpointing.md#2, darshan.md#1).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli_fork import run_main_forked
from conftest import REPO, made_once, run_cli, session_folder

DOCS = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
SHARED = (REPO / ".." / "shared").resolve()
PROGRAMS = ("dlio_ckpt", "dlio_ckpt-analyze", "dlio_ckpt-advise", "dlio_ckpt-import-dlio")
LAUNCHERS = ("mpirun", "mpiexec", "srun", "env")
SHELL_LANGUAGES = ("", "bash", "sh", "shell", "console")
MAX_RANKS = 2
# Forced tiny, an explicit dataset.num_files_train above this is lowered to it.
TINY_FILES = 16
# run.repeats above this is lowered to it: each repeat is the whole job again.
MAX_REPEATS = 2
# A workload's own drop of the page cache (the llama3 profiles' checkpoint.drop_caches, as MLPerf asks)
# is turned off where the command does not ask for it itself: the tests run as root here, where the
# drop is real, and each emptied the whole machine's cache (every later process, this suite's and
# others', read its libraries from disk again; README.md#3 alone dropped it three times). One command
# keeps it, the only real drop the suite makes: README.md's MLPerf procedure (KEEPS_DROP in its line).
DROP_CACHES = ("checkpoint.drop_caches", "storage.drop_caches")
KEEPS_DROP = "# MLPerf Storage procedure"
# Runs that read or write no data: they keep the scale the document gives.
NO_IO = ("mode=plan", "mode=datasize")
INFO_FLAGS = ("--cfg", "-c", "--help", "-h", "--version", "--list-workloads", "--info", "-i")

STUBS = r"""
PATH=/nonexistent
record() {
  { printf '%s\0' "${BASH_LINENO[1]}" "${LD_PRELOAD:+LD_PRELOAD}" "$@"; printf '\n\0'; } >> "$DOC_CALLS"
}
command_not_found_handle() { return 0; }
""" + "".join(f"{name}() {{ record {name} \"$@\"; }}\n" for name in PROGRAMS + LAUNCHERS)


# -- extracting the commands -----------------------------------------------------------------------

@dataclass
class Call:
    """One program call a document shows, as the shell would make it."""

    doc: str
    line: str  # the document's line, as written
    argv: list[str]
    preload: bool  # LD_PRELOAD was set for it
    error: str | None = None  # the `PROG: error:` line the document shows after it
    exit_code: int = 0


def shell_blocks(text: str) -> list[list[str]]:
    """The logical lines (continuations joined) of each fenced shell block."""
    blocks = []
    for match in re.finditer(r"^```([^\n`]*)\n(.*?)^```", text, re.S | re.M):
        if match.group(1).strip() not in SHELL_LANGUAGES:
            continue
        body = re.sub(r"\\\n\s*", " ", match.group(2))
        prompted = any(line.startswith("$ ") for line in body.splitlines())
        lines: list[str] = []
        for line in body.splitlines():
            # inside a quoted argument spanning lines (a command's, not printed output's: `workload's)`)
            if (lines and re.sub(r"(^|\s)#.*$", "", lines[-1]).count("'") % 2 and not line.startswith("$ ")
                    and (not prompted or lines[-1].startswith("$ "))):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line)
        blocks.append(lines)
    return blocks


def is_command(line: str, prompted: bool) -> bool:
    stripped = line.strip()
    if prompted:
        return stripped.startswith("$ ")
    first = stripped.split(" ", 1)[0] if stripped else ""
    return (first in PROGRAMS + LAUNCHERS or first in ("for", "done", "done;") or first.startswith(".venv/bin/")
            or bool(re.match(r"^[A-Z_]+=\S*$", first))
            or bool(re.search(r"(&&|;)\s*(\S*/)?(mpirun|dlio_ckpt)\b", stripped)))  # `pip install . && mpirun ...`


def block_calls(doc: str, lines: list[str], workdir: Path) -> list[Call]:
    """The calls one block makes, in order, with the error lines shown after them."""
    prompted = any(line.startswith("$ ") for line in lines)
    script, origin, errors = [], [], {}
    for line in lines:
        error = re.match(r"^(dlio_ckpt(?:-analyze|-advise|-import-dlio)?): error: ", line)
        if error and origin:
            errors.setdefault(len(script), line.strip())  # after the last command line so far
            continue
        if not is_command(line, prompted):
            continue
        command = line.strip()[2:] if prompted else line.strip()
        command = command.replace(".venv/bin/", "")
        command = re.sub(r"<([A-Za-z ]+)>", lambda m: "@" + m.group(1).replace(" ", "_") + "@", command)  # <run id>
        # A job put in the background (`... &`, then `wait`) is recorded in order, in the foreground:
        # background jobs recording at once interleaved their records (bash's printf writes a
        # record in several pieces), and the calls run one after another here anyway.
        command = re.sub(r"(?<![&|])&\s*$", "", command)
        script.append(command)
        origin.append(line.strip())
    if not script:
        return []
    calls_file, script_file = workdir / "calls", workdir / "block.sh"
    calls_file.unlink(missing_ok=True)
    script_file.write_text("\n".join(script) + "\n")  # sourced: BASH_LINENO counts its lines
    env = {"DOC_CALLS": str(calls_file), "USER": "me", "HOME": str(workdir), "DARSHAN": "/opt/darshan"}
    done = subprocess.run(["bash", "-c", STUBS + f"\nsource {shlex.quote(str(script_file))}"], env=env, cwd=workdir,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and not done.stderr, f"{doc}: a block does not run as shell:\n{script}\n{done.stderr}"
    records = calls_file.read_bytes().decode().split("\n\0") if calls_file.exists() else []
    calls = []
    for record in filter(None, records):
        fields = record.split("\0")[:-1]
        number, preload, argv = int(fields[0]), fields[1] == "LD_PRELOAD", fields[2:]
        line = origin[number - 1]
        exit_code = int(m.group(1)) if (m := re.search(r"#.*\bexit (\d+)", line)) else 0
        error = errors.get(number)
        calls.append(Call(doc, line, argv, preload, error, 2 if error else exit_code))
    return calls


def doc_calls(doc: Path, workdir: Path) -> list[list[Call]]:  # the extraction's own test reads a whole document
    """Every block's calls (blocks without a program call are left out)."""
    out = []
    for lines in shell_blocks(doc.read_text()):
        calls = [c for c in block_calls(doc.name, lines, workdir) if program_of(c.argv)]
        if calls:
            out.append(calls)
    return out


def program_of(argv: list[str]) -> str | None:
    """The dlio_ckpt program a call runs, behind any launcher."""
    return next((a for a in argv if a in PROGRAMS), None)


# -- adapting a call ------------------------------------------------------------------------------

@dataclass
class Adapted:
    program: str
    args: list[str]
    ranks: int = 0  # 0: serial
    only: str | None = None  # why it is checked for composition only
    synopsis: bool = False
    serial: str | None = None  # why a documented mpirun command runs on one rank here


# Where the rank count of a documented mpirun command matters to what its block shows (mpi_reason).
MPI_DOCS = {"scale-out.md": "the document is about running across ranks"}
RANK_KEYS = ("checkpoint.strategy", "checkpoint.layout", "checkpoint.levels", "checkpoint.replicas",
             "model.parallelism", "world.")
# (document, an argument of the command): what the prose around it says of its ranks
MPI_BY_PROSE = {
    ("README.md", "workload=resnet scale=tiny"): "the quickstart runs it 'on two MPI ranks'",
    ("README.md", "workload=unet3d scale=tiny"): "the output shown after it counts '2 ranks x batch 4'",
    ("workloads.md", "scale=tiny"): "'Both run at scale=tiny on 2 ranks'",
    ("checkpointing.md", "mode=restore"): "the document's only mpirun command: a restore on the ranks of the job",
    ("darshan.md", "workload=replay"): "the document's only mpirun run: a log's ranks replayed on the world's",
    ("dlio-compat.md", "dlio_config="): "the document's only mpirun command; the prose checks the bytes 'under mpirun -n 2'",
}


def mpi_reason(call: Call, args: list[str]) -> str | None:
    """Why a documented mpirun command must run under MPI here, or None: it then runs serially,
    with the same arguments (the MPI start-up alone costs ~4 s of CPU, and most blocks show what one
    rank shows as well)."""
    if call.doc in MPI_DOCS:
        return MPI_DOCS[call.doc]
    if call.error:
        return "it shows an error line, which may depend on the ranks"
    if key := next((a.split("=", 1)[0] for a in args if a.startswith(RANK_KEYS)), None):
        return f"it sets {key}, which depends on the ranks"
    joined = " ".join(args)
    return next((why for (doc, arg), why in MPI_BY_PROSE.items() if doc == call.doc and arg in joined), None)


def unwrap(call: Call) -> Adapted:
    """Peel mpirun/mpiexec/srun/env off a call: the program, its arguments, the ranks, and why a
    call can only be composed here."""
    argv, ranks, only = list(call.argv), 0, None
    preload = call.preload
    while argv and argv[0] not in PROGRAMS:
        launcher = argv.pop(0)
        if launcher == "env":
            while argv and "=" in argv[0]:
                preload |= argv.pop(0).startswith("LD_PRELOAD=")
        elif launcher in ("mpirun", "mpiexec"):
            while argv and argv[0].startswith("-"):
                flag = argv.pop(0)
                value = argv.pop(0) if flag in ("-np", "-n", "-ppn", "-hostfile", "--hostfile", "--map-by", "-x") else None
                if flag in ("-np", "-n"):
                    ranks = min(int(value), MAX_RANKS)
                if flag == "-x" and value.startswith("LD_PRELOAD="):
                    preload = True
                if flag == "-env":
                    name, _ = argv.pop(0), argv.pop(0)
                    preload |= name == "LD_PRELOAD"
        elif launcher == "srun":
            only = "srun needs Slurm; the composed job is checked instead"
            while argv and argv[0].startswith("-"):
                flag = argv.pop(0)
                preload |= "LD_PRELOAD=" in flag
                if flag in ("-n", "-N") and argv:
                    argv.pop(0)
        else:
            raise AssertionError(f"{call.doc}: unknown launcher {launcher} in: {call.line}")
    serial = None
    if ranks and not mpi_reason(call, argv[1:]):
        ranks, serial = 0, f"serially: the document runs it under mpirun, but its block shows nothing the ranks change"
    if preload:
        only = ("LD_PRELOAD of darshan-runtime needs libdarshan (tests/test_darshan_runtime.py runs it where it is "
                "built); the composed job is checked instead")
    return Adapted(argv[0], argv[1:], ranks, only, serial=serial)


class Fixtures:
    """What the documents' placeholders stand for, made on first use in one temporary folder.

    The folder is shared by the session's test workers: the first worker that needs a fixture makes
    it under a lock, the others wait for it and reuse it (each worker made its own before: three
    tiny runs with Darshan logs and a sweep, ~9 s of each worker's time). The tests only read them:
    a run folder a document names is a copy (`place`), reports go to the test's own folder."""

    def __init__(self, base: Path):
        self.base = base
        self.made: dict[str, Path] = {}

    def _once(self, name: str, make) -> None:
        made_once(self.base / "fixtures", name, lambda _: make())

    def _run(self, name: str, args: list[str]) -> Path:
        if name not in self.made:
            folder = self.base / "fixtures" / name
            root = [] if any(a.startswith("storage.root=") for a in args) else [f"storage.root={self.base / 'fixtures' / 'store'}"]

            def make() -> None:
                done = run_cli([*args, *root, "progress=false"], self.base)
                assert done.returncode == 0, f"fixture {name}: {done.stderr}"

            self._once(name, make)
            self.made[name] = folder
        return self.made[name]

    def run_folder(self) -> Path:
        """A tiny run with checkpoints, failures and a Darshan log with DXT."""
        return self._run("run", ["workload=unet3d", "scale=tiny", "checkpoint.enabled=true", "trace.darshan=true",
                                 "checkpoint.steps_between_checkpoints=2", "failures.at_steps=[3]",
                                 f"hydra.run.dir={self.base / 'fixtures' / 'run'}"])

    def checkpoints(self, workload: str) -> Path:
        """A tiny mode=checkpoint run's checkpoint folder of `workload` (for checkpoint.restore_from)."""
        store = self.base / "fixtures" / f"ckpt-{workload}"
        self._run(f"ckpt-{workload}", [f"workload={workload}", "scale=tiny", "mode=checkpoint", f"storage.root={store}",
                                       f"hydra.run.dir={self.base / 'fixtures' / ('ckpt-run-' + workload)}"])
        (folder,) = (store / "checkpoints").iterdir()
        return folder

    def sweep_folder(self) -> Path:
        return self._run("sweep", ["-m", "workload=unet3d", "scale=tiny", "checkpoint.strategy=sync,async",
                                   f"hydra.sweep.dir={self.base / 'fixtures' / 'sweep'}"])

    def darshan_log(self) -> Path:
        (log,) = self.run_folder().glob("*.darshan")
        return log

    def no_dxt_log(self) -> Path:
        if "nodxt" not in self.made:
            from test_replay_approx import no_dxt_log

            folder = self.base / "fixtures" / "nodxt"

            def make() -> None:
                folder.mkdir(parents=True)
                no_dxt_log(folder)

            self._once("nodxt", make)
            (self.made["nodxt"],) = folder.glob("*.darshan")
        return self.made["nodxt"]

    def dlio_yaml(self) -> Path:
        """DLIO 2.0.0's unet3d_h100.yaml, as DLIO publishes it (DLIO's files are not shipped here:
        docs/dlio-compat.md says where they live)."""
        path = self.base / "fixtures" / "unet3d_h100.yaml"
        self._once(path.name, lambda: path.write_text(UNET3D_H100))
        return path

    def workload_file(self) -> Path:
        path = self.base / "fixtures" / "my.yaml"
        self._once(path.name, lambda: shutil.copy(REPO / "workloads" / "unet3d.yaml", path))
        return path


UNET3D_H100 = """model:
  name: unet3d
  type: cnn
  model_size: 499153191

framework: pytorch

workflow:
  generate_data: False
  train: True
  checkpoint: True

dataset:
  data_folder: data/unet3d/
  format: npz
  num_files_train: 168
  num_samples_per_file: 1
  record_length_bytes: 146600628
  record_length_bytes_stdev: 68341808
  record_length_bytes_resize: 2097152

reader:
  data_loader: pytorch
  batch_size: 7
  read_threads: 4
  file_shuffle: seed
  sample_shuffle: seed

train:
  epochs: 5
  computation_time: 0.323

checkpoint:
  checkpoint_folder: checkpoints/unet3d
  checkpoint_after_epoch: 5
  epochs_between_checkpoints: 2

metric:
  au: 0.90
"""


def place(path: str, cwd: Path, fixtures: Fixtures, kind: str = "run") -> str:
    """A path argument of an analysis command: the real shared logs, a fixture for a placeholder,
    or a folder an earlier command of the document made (kept as written)."""
    if path.startswith("../shared/"):
        return str(SHARED / path[len("../shared/"):])
    if path.endswith(".darshan"):
        if (cwd / path).exists():
            return path
        return str(fixtures.no_dxt_log() if "nodxt" in path else fixtures.darshan_log())
    if (cwd / path).exists() or path.startswith("-"):
        return path
    source = fixtures.sweep_folder() if kind == "sweep" else fixtures.run_folder()
    shutil.copytree(source, cwd / path)  # a run folder the document names but does not make
    return path


def adapt_dlio_ckpt(adapted: Adapted, previous: list[str], workdir: Path, fixtures: Fixtures, index: int,
                    shows_error: bool = False, drops_cache: bool = False) -> Adapted:
    args = [a for a in adapted.args if not (a.startswith("[") and a.endswith("]"))]  # a synopsis' optional parts
    if args[:1] == ["..."]:  # `dlio_ckpt ... key=value`: the previous command's arguments, then these
        given = {a.split("=", 1)[0] for a in args[1:]}
        args = [a for a in previous if a.split("=", 1)[0] not in given] + args[1:]
    args = [a for a in args if a != "..."]  # `workload=unet3d ...`: the rest as shown before
    store = workdir / "store"
    # Slurm's dry run checks every job at the job size the document asks for, and runs nothing: as written
    slurm = any(a.startswith("hydra/launcher=slurm") for a in args)
    if any(a.startswith("storage.backend=s3") for a in args):
        adapted.only = "an S3 endpoint needs its server (tests/test_s3_end_to_end.py runs S3 on a local one)"
    out = []
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "storage.root":
            arg = f"storage.root={store}"
        elif key in ("dataset.folder",) and value.startswith("/"):
            arg = f"{key}={workdir / 'outside' / Path(value).name}"
        elif key == "checkpoint.restore_from":  # the block's own checkpoints, else a fixture's of the workload
            made = list((store / "checkpoints").iterdir()) if (store / "checkpoints").is_dir() else []
            workload = next((a.split("=", 1)[1] for a in args if a.startswith("workload=")), "unet3d")
            newest = max(made, key=lambda p: p.stat().st_mtime) if made else fixtures.checkpoints(workload)
            arg = f"{key}={newest}"
        elif key == "replay.log":
            arg = f"{key}={place(value, workdir / 'cwd', fixtures)}"
        elif key == "workload" and value.startswith("/"):
            arg = f"workload={fixtures.workload_file()}"
        elif key == "dlio_config" and not (workdir / "cwd" / value).exists():
            arg = f"dlio_config={fixtures.dlio_yaml()}"
        elif key == "dataset.num_files_train" and value.isdigit() and int(value) > TINY_FILES and not slurm:
            arg = f"{key}={TINY_FILES}"  # forced tiny: more files only make the run longer
        elif key == "run.repeats" and value.isdigit() and int(value) > MAX_REPEATS and not slurm:
            arg = f"{key}={MAX_REPEATS}"  # two repeats exercise the aggregation (mean, std, min..max) as five do
        elif key == "checkpoint.levels":
            arg = re.sub(r"path: /[^,}]*", lambda m: f"path: {workdir / 'levels' / Path(m.group(0)[6:]).name}", arg)
        out.append(arg)
    info = any(a in INFO_FLAGS for a in out)
    multirun = "-m" in out or "--multirun" in out
    if adapted.only and not info:
        out = ["--cfg", "job", *out]
        info = True
    if info:
        adapted.ranks = 0  # printing the composed job needs no ranks
    if slurm and "--slurm-dry-run" not in out:
        out.insert(0, "--slurm-dry-run")  # submitting needs Slurm; the dry run composes every job and prints the script
    if not info and not slurm and not any(a in NO_IO for a in out) and out not in (["--list-workloads"], ["--version"]):
        if not shows_error:  # an error example runs at its own scale: it stops before anything is written
            kept = [] if drops_cache else [f"{key}=false" for key in DROP_CACHES if not any(a.startswith(key + "=") for a in out)]
            out = [a for a in out if not a.startswith("scale=")] + kept + ["scale=tiny"]
        if not any(a.startswith("storage.root=") for a in out):
            out.append(f"storage.root={store}")
    if not info:
        key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
        if not any(a.startswith(key + "=") for a in out):
            out.append(f"{key}=doc-{'sweeps' if multirun else 'runs'}/{index}")
    return Adapted(adapted.program, out, adapted.ranks, adapted.only, serial=adapted.serial)


def adapt(call: Call, previous: list[str], workdir: Path, fixtures: Fixtures, index: int) -> Adapted:
    adapted = unwrap(call)
    cwd = workdir / "cwd"
    if any(re.fullmatch(r"[A-Z][A-Z_]+", a) for a in adapted.args):  # RUN_OR_SWEEP_FOLDER: a synopsis
        adapted.synopsis = True
        return adapted
    if adapted.program == "dlio_ckpt":
        return adapt_dlio_ckpt(adapted, previous, workdir, fixtures, index, call.error is not None,
                               KEEPS_DROP in call.line)
    if adapted.program == "dlio_ckpt-import-dlio":  # its first argument is the DLIO file; -o names the output
        args = list(adapted.args)
        if args and not args[0].startswith("-") and not (cwd / args[0]).exists():
            args[0] = str(fixtures.dlio_yaml())
        return Adapted(adapted.program, args)
    if adapted.program == "dlio_ckpt-analyze" and call.error:  # an error example names what is not there
        return adapted
    if adapted.program == "dlio_ckpt-analyze":
        args, kind = [], "run"
        for i, arg in enumerate(adapted.args):
            if arg == "--compare":
                operands = [a for a in adapted.args[i + 1:] if not a.startswith("-")]
                kind = "sweep" if len(operands) == 1 else "run"
            if arg.startswith("-") or adapted.args[i - 1] in ("--out-dir", "--output", "--format", "--baseline") and i:
                args.append(arg)
            else:
                args.append(place(arg, cwd, fixtures, "sweep" if arg.startswith("multirun/") else kind))
        return Adapted(adapted.program, args)
    return adapted


# -- running --------------------------------------------------------------------------------------

def run_in_fork(program: str, args: list[str], cwd: Path) -> tuple[int, str, str]:
    """An analysis-side program forked from the tests' analysis server (cli_fork.py), which has
    PyDarshan, pandas and matplotlib imported: as isolated as a process, without its start-up."""
    done = run_main_forked(program, args, cwd)
    return done.returncode, done.stdout, done.stderr


def execute(adapted: Adapted, cwd: Path) -> tuple[int, str, str]:
    if adapted.program == "dlio_ckpt":
        done = run_cli(adapted.args, cwd, mpi_ranks=adapted.ranks)
        return done.returncode, done.stdout, done.stderr
    return run_in_fork(adapted.program, adapted.args, cwd)


def synopsis_flags_are_real(adapted: Adapted, cwd: Path) -> None:
    """A synopsis' options must be the program's: each appears in its --help."""
    code, out, _ = execute(Adapted(adapted.program, ["--help"]), cwd)
    assert code == 0
    for flag in re.findall(r"--[a-z][a-z-]+", " ".join(adapted.args)):
        assert flag in out, f"{adapted.program} has no option {flag}"


def matches(documented: str, printed: str, paths: dict[str, str] | None = None) -> bool:
    """The documented error line, where `...` and `(...)` stand for text that varies, as do the
    decimal numbers (free space, sizes) and the paths the test put elsewhere (`paths`: documented -> used)."""
    for written, used in (paths or {}).items():
        documented = documented.replace(written, used)
    documented, printed = re.sub(r"\d+\.\d+", "#", documented), re.sub(r"\d+\.\d+", "#", printed)
    pieces = [p.strip() for p in re.split(r"\(\.\.\.\)|\.\.\.", documented) if p.strip()]
    position = 0
    for piece in pieces:
        found = printed.find(piece, position)
        if found < 0:
            return False
        position = found + len(piece)
    return True


def run_dir_of(adapted: Adapted) -> str | None:
    return next((a.split("=", 1)[1] for a in adapted.args if a.startswith("hydra.run.dir=")), None)


def short_of_space(error: str, workdir: Path) -> bool:
    """The temporary folder's disk has less free space than the run the error line shows needs."""
    need = float(re.search(r"needs at least ([\d.]+) GiB", error).group(1))
    return shutil.disk_usage(workdir).free < need * (1 << 30)


@dataclass
class Outcome:
    call: Call
    adapted: Adapted
    code: int = 0
    problems: list[str] = field(default_factory=list)


def run_block(doc: str, lines: list[str], workdir: Path, fixtures: Fixtures) -> list[Outcome]:
    """Run one block's calls in order (a block's later commands read what its earlier ones made)."""
    cwd = workdir / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    outcomes, seen, previous = [], {}, []
    for call in (c for c in block_calls(doc, lines, workdir) if program_of(c.argv)):
        adapted = adapt(call, previous, workdir, fixtures, len(outcomes))
        if adapted.program == "dlio_ckpt" and unwrap(call).args[:1] != ["..."]:
            previous = unwrap(call).args
        outcome = Outcome(call, adapted)
        outcomes.append(outcome)
        if adapted.synopsis:
            synopsis_flags_are_real(adapted, cwd)
            continue
        key = (adapted.program, tuple(a for a in adapted.args if not a.startswith("hydra.run.dir=")), adapted.ranks)
        if key in seen:  # the same command, adapted, ran already (the launcher variants, a loop over -np N)
            outcome.code, folder = seen[key]
            named = run_dir_of(adapted)
            if folder and named and not (cwd / named).exists():
                shutil.copytree(cwd / folder, cwd / named)  # the same run, in the folder this command names
            continue
        if call.error and "GiB free" in call.error and not short_of_space(call.error, workdir):
            continue  # a free-space refusal shows only where the disk has less room than the documented need
        code, out, err = execute(adapted, cwd)
        outcome.code = code
        seen[key] = (code, run_dir_of(adapted))
        if code != call.exit_code:
            outcome.problems.append(f"exit {code}, expected {call.exit_code}: {err.strip()[-600:] or out[-600:]}")
        if call.error:
            printed = next((l for l in err.splitlines() if ": error: " in l), "")
            roots = {a.split("=", 1)[1]: b.split("=", 1)[1] for a, b in zip(unwrap(call).args, adapted.args)
                     if a.startswith("storage.root=") and b.startswith("storage.root=")}
            if not matches(call.error, printed, roots):
                outcome.problems.append(f"prints {printed!r}, the document shows {call.error!r}")
    return outcomes


def command_blocks() -> list[tuple[Path, int]]:
    """(document, block index) of every shell block that names a program: one test each, so the
    blocks run in parallel under xdist."""
    found = []
    for doc in DOCS:
        for index, lines in enumerate(shell_blocks(doc.read_text())):
            if any(re.search(rf"(^|[\s/$]){re.escape(p)}(\s|$)", line) for line in lines for p in PROGRAMS):
                found.append((doc, index))
    return found


BLOCKS = command_blocks()


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Fixtures:
    """Made once per session, on first use, in a folder the session's xdist workers share."""
    return Fixtures(session_folder(tmp_path_factory) / "doc-fixtures")


@pytest.mark.parametrize("doc, index", BLOCKS, ids=[f"{d.relative_to(REPO)}#{i}" for d, i in BLOCKS])
def test_every_documented_command_runs(doc, index, tmp_path, fixtures):
    lines = shell_blocks(doc.read_text())[index]
    if any("../shared/" in line for line in lines) and not SHARED.is_dir():
        pytest.skip("../shared (the real Darshan logs) is not here")
    outcomes = run_block(doc.name, lines, tmp_path, fixtures)
    assert outcomes, f"{doc.name} block {index}: no command found in it"
    failed = [f"{o.call.line}\n    ran: {o.adapted.program} {shlex.join(o.adapted.args)}"
              f"{f' under mpirun -n {o.adapted.ranks}' if o.adapted.ranks else ''}{f' ({o.adapted.serial})' if o.adapted.serial else ''}\n    " + "\n    ".join(o.problems)
              for o in outcomes if o.problems]
    assert not failed, f"{doc.name}: documented commands that do not do what the document says:\n" + "\n".join(failed)


def test_every_document_with_mpirun_commands_runs_one_under_mpi(tmp_path):
    """Most documented mpirun commands run serially here (mpi_reason); each document that shows
    mpirun runs still runs at least one of them under MPI."""
    launched, under_mpi = set(), set()
    for doc, index in BLOCKS:
        for call in block_calls(doc.name, shell_blocks(doc.read_text())[index], tmp_path):
            composed = program_of(call.argv) and (unwrap(call).only or "storage.backend=s3" in call.argv)  # not run
            if call.argv[0] in ("mpirun", "mpiexec") and program_of(call.argv) and not composed:
                launched.add(doc.name)
                if unwrap(call).ranks:
                    under_mpi.add(doc.name)
    assert launched >= {"README.md", "scale-out.md", "workloads.md"}
    assert under_mpi == launched


# -- the extraction itself ------------------------------------------------------------------------

def test_the_extraction_finds_the_commands_as_a_shell_would_run_them(tmp_path):
    text = """
```bash
for s in a b; do                     # compare
  mpirun -np 8 dlio_ckpt workload=bert checkpoint.strategy=$s hydra.run.dir=runs/bert-$s; done
dlio_ckpt ... x=1    # exit 75
mpirun -n 8 -x LD_PRELOAD=$DARSHAN/lib/libdarshan.so dlio_ckpt workload=unet3d
```

```
$ dlio_ckpt reader.batch_sise=4
dlio_ckpt: error: unknown config key
$ dlio_ckpt --version
```

```yaml
dlio_ckpt: not a command
```
"""
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    blocks = doc_calls(doc, tmp_path)
    assert [[c.argv for c in block] for block in blocks] == [
        [["mpirun", "-np", "8", "dlio_ckpt", "workload=bert", "checkpoint.strategy=a", "hydra.run.dir=runs/bert-a"],
         ["mpirun", "-np", "8", "dlio_ckpt", "workload=bert", "checkpoint.strategy=b", "hydra.run.dir=runs/bert-b"],
         ["dlio_ckpt", "...", "x=1"],
         ["mpirun", "-n", "8", "-x", "LD_PRELOAD=/opt/darshan/lib/libdarshan.so", "dlio_ckpt", "workload=unet3d"]],
        [["dlio_ckpt", "reader.batch_sise=4"], ["dlio_ckpt", "--version"]]]
    assert blocks[0][2].exit_code == 75 and blocks[1][0].error == "dlio_ckpt: error: unknown config key"
    assert blocks[1][0].exit_code == 2 and blocks[1][1].error is None
    fixtures = Fixtures(tmp_path)
    bert = adapt(blocks[0][0], [], tmp_path, fixtures, 0)
    assert bert.ranks == 2 and bert.args[-2:] == ["scale=tiny", f"storage.root={tmp_path / 'store'}"]
    assert bert.args[-4:-2] == [f"{key}=false" for key in DROP_CACHES]  # the page cache is left alone
    mlperf = adapt(Call("README.md", "mpirun dlio_ckpt workload=llama3_8b mode=checkpoint  " + KEEPS_DROP,
                        ["dlio_ckpt", "workload=llama3_8b", "mode=checkpoint"], False), [], tmp_path, fixtures, 2)
    assert not any("drop_caches" in a for a in mlperf.args)  # the one command that drops it, as documented
    asked = adapt(Call("x.md", "", ["dlio_ckpt", "workload=unet3d", "storage.drop_caches=true"], False), [], tmp_path,
                  fixtures, 4)
    assert "storage.drop_caches=true" in asked.args and "checkpoint.drop_caches=false" in asked.args
    assert bert.serial is None  # it sets checkpoint.strategy: the ranks matter
    plain = adapt(Call("README.md", "", ["mpirun", "-np", "8", "dlio_ckpt", "workload=resnet"], False), [], tmp_path,
                  fixtures, 3)
    assert plain.ranks == 0 and plain.serial.startswith("serially") and "workload=resnet" in plain.args
    scale_out = unwrap(Call("scale-out.md", "", ["mpirun", "-np", "8", "dlio_ckpt", "workload=resnet"], False))
    assert scale_out.ranks == 2 and scale_out.serial is None
    refused = unwrap(Call("x.md", "", ["mpirun", "-np", "8", "dlio_ckpt", "a=1"], False, error="dlio_ckpt: error: x"))
    assert refused.ranks == 2
    again = adapt(blocks[0][2], unwrap(blocks[0][0]).args, tmp_path, fixtures, 1)
    assert again.args[:3] == ["workload=bert", "checkpoint.strategy=a", "hydra.run.dir=runs/bert-a"] and "x=1" in again.args
    preloaded = adapt(blocks[0][3], [], tmp_path, fixtures, 2)
    assert preloaded.only.startswith("LD_PRELOAD") and preloaded.args[:2] == ["--cfg", "job"]
    assert matches("dlio_ckpt: error: 4 ranks but only 2 samples (...); raise it", "dlio_ckpt: error: 4 ranks but only "
                   "2 samples (x y); raise it")
    assert not matches("dlio_ckpt: error: 4 ranks", "dlio_ckpt: error: 2 ranks")
    # an apostrophe in printed output opens no quoted argument: the next `$ ` command is its own line
    printed = shell_blocks("```\n$ dlio_ckpt a=1\nthe workload's figures\n$ mpirun -np 2 dlio_ckpt b=2\n```\n")
    assert [line for line in printed[0] if line.startswith("$ ")] == ["$ dlio_ckpt a=1", "$ mpirun -np 2 dlio_ckpt b=2"]
