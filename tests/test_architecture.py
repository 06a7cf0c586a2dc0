"""The package's layers point only down (docs/architecture.md, "Layers").

Why: an import that reaches up a layer, or a circle of imports, ties a low module to everything
above it, and an import hidden inside a function hides that tie from the reader and from Python
until the call. Every module's imports are read with `ast` (inside functions too) and checked
against one table; a new module in a new subpackage must be given a layer here first.
"""

from __future__ import annotations

import ast
import collections
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Top to bottom: a unit may import units of its own layer or of any layer below it, never above.
# A unit is a subpackage (or a top-level module) of dlio_ckpt. The value types every layer reads
# (schema.py and typed.py: the RunConfig) and the registry tables of names (codec_registry.py,
# strategy_registry.py) are top-level modules on the ground floor, below every subpackage that
# reads them; a backend's options table (storage/s3_options.py, which the RunConfig holds) is a
# unit of its own there. The config loader (config/: composing, checking every override against
# plans, formats and storage) sits at the top, above everything it checks.
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("commands", frozenset({"__main__", "cli", "slurm", "sweep", "import_dlio", "clean", "datasize"})),
    ("offline tools", frozenset({"analysis", "advisor", "describe", "profile"})),
    ("config loader", frozenset({"config"})),
    ("engine", frozenset({"engine"})),
    ("checkpoint", frozenset({"checkpoint"})),
    ("codec, state", frozenset({"codec", "state"})),
    ("plan", frozenset({"plan"})),
    ("formats", frozenset({"formats"})),
    ("results", frozenset({"metrics", "trace"})),
    ("storage", frozenset({"storage"})),
    ("ground", frozenset({"schema", "typed", "codec_registry", "strategy_registry", "value types", "errors",
                          "registry", "world", "content", "optional", "memory", "faults", "local_output",
                          "local_fs", "option_types", "dlio_ckpt"})),
)

# Units of their own inside a subpackage (module -> unit).
SPLIT_UNITS = {"dlio_ckpt.storage.s3_options": "value types"}

# The offline tools read results (run folders, Darshan logs, saved checkpoints): they never reach
# into what runs a job, although the table puts them above it.
TOOLS = frozenset({"analysis", "advisor", "describe", "profile"})
NOT_FOR_TOOLS = frozenset({"config", "engine", "checkpoint", "clean", "cli"})

# Modules that may import dlio_ckpt modules inside a function, with the reason. Optional
# third-party libraries (torch, tensorflow, h5py, obstore, hydra ...) and the optional compiled
# extensions (a `.c` beside the module: codec/_lossy_c.c, storage/_trace_c.c) may always be
# imported where they are used, inside a try.
LAZY_ALLOWED: dict[str, str] = {
    "dlio_ckpt.cli": "the command dispatcher imports only the command it runs, so `dlio_ckpt clean`, `--version` "
                     "and a Slurm submission start without Hydra, numpy and the engine (0.27 s to import, not 1.0 s)",
    "dlio_ckpt.storage.posix": "the POSIX backend's traced-handle hook returns its own handle class's traced subclass, "
                               "which lives in traced.py beside the tracer and subclasses posix.py's PosixFile; the "
                               "hook resolves it on first use (the one circle left: storage/ with itself)",
}

@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    line: int
    in_function: bool

    def where(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}"


def module_files() -> dict[str, Path]:
    """Every module by its installed name; analysis/ is installed as dlio_ckpt.analysis."""
    found = {}
    for base, prefix in ((REPO / "dlio_ckpt", ("dlio_ckpt",)), (REPO / "analysis", ("dlio_ckpt", "analysis"))):
        for path in base.rglob("*.py"):
            parts = prefix + path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _named_module(name: str, modules: dict[str, Path]) -> str:
    """The module an import names: `from a.b import c` names a.b.c when c is a module, else a.b."""
    while name not in modules and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _compiled_extension(name: str) -> bool:
    """An optional C extension (built where a compiler is), imported as an optional library is."""
    parts = name.split(".")
    return parts[-1].startswith("_") and (REPO.joinpath(*parts[:-1]) / f"{parts[-1]}.c").is_file()


def _function_nodes(tree: ast.AST) -> set[int]:
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(child) for child in ast.walk(node) if child is not node)
    return inside


def import_edges(modules: dict[str, Path]) -> list[Edge]:
    edges = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        inside = _function_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets = [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                if (target == "dlio_ckpt" or target.startswith("dlio_ckpt.")) and not _compiled_extension(target):
                    imported = _named_module(target, modules)
                    if imported != name:
                        edges.add(Edge(name, imported, node.lineno, id(node) in inside))
    return sorted(edges, key=lambda e: (e.importer, e.line, e.imported))


def unit(module: str) -> str:
    if module in SPLIT_UNITS:
        return SPLIT_UNITS[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_of() -> dict[str, int]:
    return {name: rank for rank, (_, units) in enumerate(LAYERS) for name in units}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    """Every import, less the allowed lazy ones (LAZY_ALLOWED: each says why)."""
    return [e for e in import_edges(module_files()) if not (e.in_function and e.importer in LAZY_ALLOWED)]


def test_every_unit_has_a_layer():
    layers = layer_of()
    missing = sorted({unit(m) for m in module_files()} - set(layers))
    assert not missing, f"give these a layer in LAYERS (and docs/architecture.md): {missing}"


def test_no_import_goes_up_a_layer(edges):
    layers = layer_of()
    upward = [e.where() for e in edges if layers[unit(e.importer)] > layers[unit(e.imported)]]
    assert not upward, "imports that go up the layer table:\n" + "\n".join(upward)


def test_offline_tools_never_reach_into_a_run(edges):
    reaching = [e.where() for e in edges if unit(e.importer) in TOOLS and unit(e.imported) in NOT_FOR_TOOLS]
    assert not reaching, "\n".join(reaching)


def test_no_cycle_between_units(edges):
    graph = collections.defaultdict(set)
    for e in edges:
        if unit(e.importer) != unit(e.imported):
            graph[unit(e.importer)].add(unit(e.imported))
    assert not cycles(graph)


def test_no_cycle_between_subpackages(edges):
    """The same on whole subpackages, the split units counted with their folder: a shared piece
    lives below both sides, not inside one of them (config/schema.py once closed config <-> plan)."""
    def folder(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else parts[0]

    graph = collections.defaultdict(set)
    for e in edges:
        if folder(e.importer) != folder(e.imported):
            graph[folder(e.importer)].add(folder(e.imported))
    assert not cycles(graph)


def test_no_cycle_between_modules(edges):
    graph = collections.defaultdict(set)
    for e in edges:
        graph[e.importer].add(e.imported)
    assert not cycles(graph)


def test_no_package_import_inside_a_function(edges):
    hidden = [e.where() for e in edges if e.in_function and e.importer not in LAZY_ALLOWED]
    assert not hidden, f"{len(hidden)} imports of dlio_ckpt modules inside functions:\n" + "\n".join(hidden)


def test_the_exceptions_name_existing_modules():
    """An exception for a module that was renamed or removed would excuse nothing, silently."""
    modules = module_files()
    assert set(LAZY_ALLOWED) <= set(modules)
    hidden = {e.importer for e in import_edges(modules) if e.in_function}
    assert set(LAZY_ALLOWED) <= hidden, "a start-up exception that imports nothing lazily any more goes"


def test_the_checker_sees_each_kind_of_violation():
    """The checks above can fail: a cycle, an upward edge and a hidden import are each found."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse("import os\ndef f():\n    from dlio_ckpt.engine import run\n")
    inside = _function_nodes(tree)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [id(n) in inside for n in imports] == [False, True]
    layers = layer_of()
    assert layers[unit("dlio_ckpt.storage.posix")] > layers[unit("dlio_ckpt.engine.run")]
    assert unit("dlio_ckpt.storage.s3_options") == "value types" and unit("dlio_ckpt.config.load") == "config"
    assert unit("dlio_ckpt.analysis.report") == "analysis" and unit("dlio_ckpt.cli") == "cli"
    assert _compiled_extension("dlio_ckpt.codec._lossy_c") and not _compiled_extension("dlio_ckpt.codec.lossy")
