"""The storage protocol (storage/base.py) is complete and every backend meets it.

Every registered backend, and the tracer's view of it, has each member the protocol declares;
the optional groups (rename, writev/write_stream) are there exactly where the capability flag
says; a call a backend lacks the capability for is refused (io.UnsupportedOperation) and leaves
nothing; each backend declares its options table, which the config points at; an unknown key
under a backend's section is one line naming it, exit 2, nothing written; and no module outside
storage/ names a backend or imports a backend's module.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import typing
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from dlio_ckpt.config.load import load_config, validate_command_line
from dlio_ckpt.schema import StorageConfig
from dlio_ckpt.errors import ConfigError
from dlio_ckpt.storage import BACKENDS, backend_class, make_backend
from dlio_ckpt.storage.base import CAPABILITY_MEANING, OPTIONAL_MEMBERS, Capabilities, StorageBackend, StorageFile
from dlio_ckpt.storage.events import OP_CODE, EventRecorder, JobClock
from dlio_ckpt.storage.traced import TracedStorage

PACKAGE = Path(__file__).resolve().parents[1] / "dlio_ckpt"
CONFIG_YAML = PACKAGE.parent / "conf" / "config.yaml"
NAMES = sorted(BACKENDS.entries)


def members(protocol: type) -> set[str]:
    """What a protocol declares: its annotated attributes and its methods."""
    return set(protocol.__annotations__) | {name for name, value in vars(protocol).items()
                                            if callable(value) and not name.startswith("_")}


def overrides(name: str, root: Path, request) -> list[str]:
    """The command line that chooses backend `name` for `root` (S3: on the tests' moto server)."""
    if name != "s3":
        return [f"storage.backend={name}", f"storage.root={root}"]
    server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
    return ["storage.backend=s3", f"storage.root={root}", f"storage.s3.bucket={bucket}",
            f"storage.s3.endpoint_url={server.endpoint_url}", "storage.s3.part_size=5MiB", "storage.s3.prefix=protocol"]


@pytest.fixture(params=NAMES)
def backend(request, tmp_path):
    """Each registered backend, built from the config as a run builds it."""
    return make_backend(load_config(overrides(request.param, tmp_path / "store", request)).storage)


def traced(backend) -> TracedStorage:
    return TracedStorage(backend, EventRecorder(rank=0, clock=JobClock.start())).with_phase("checkpoint")


def test_the_protocol_declares_what_the_issue_found_missing():
    assert {"fsync_dir", "traced_handle", "root", "capabilities", "name", "uri"} <= members(StorageBackend)
    assert {"write_at", "truncate", "fsync", "close", "abort", "fileno", "flush"} <= members(StorageFile)
    assert {flag: sorted(members(group)) for flag, (group, _) in OPTIONAL_MEMBERS.items()} == {
        "atomic_rename": ["rename"], "stream_writes": ["write_stream", "writev"]}
    # every flag has the words the loader's refusal uses for it
    assert set(CAPABILITY_MEANING) == {f.name for f in dataclasses.fields(Capabilities)}


def test_every_backend_and_its_traced_view_have_every_member_of_the_backend_protocol(backend):
    for storage in (backend, traced(backend)):
        assert isinstance(storage, StorageBackend)
        assert [m for m in sorted(members(StorageBackend)) if not hasattr(storage, m)] == []
    assert traced(backend).root == backend.root


def test_every_handle_of_every_backend_has_every_member_of_the_file_protocol(backend, tmp_path):
    path = str(tmp_path / "store" / "protocol" / "file.bin")
    backend.makedirs(str(tmp_path / "store" / "protocol"))
    backend.write_atomic(path, b"0123456789")
    for storage in (backend, traced(backend)):
        for handle in (storage.open_read(path), storage.open_write(path + ".new"), storage.open_staged(path + ".new")):
            try:
                assert isinstance(handle, StorageFile)
                assert [m for m in sorted(members(StorageFile)) if not hasattr(handle, m)] == []
            finally:
                handle.abort()
    assert backend.read_whole(path) == b"0123456789" and not backend.exists(path + ".new")


def test_the_optional_members_are_there_exactly_where_the_capability_says(backend, tmp_path):
    backend.makedirs(str(tmp_path / "store"))
    for flag, (group, carrier) in OPTIONAL_MEMBERS.items():
        offered = getattr(backend.capabilities, flag)
        for storage in (backend, traced(backend)):
            if carrier == "backend":
                assert {m: hasattr(storage, m) for m in members(group)} == dict.fromkeys(members(group), offered), flag
                continue
            handle = storage.open_write(str(tmp_path / "store" / f"{flag}.bin"))
            try:
                # the tracer's own POSIX handles carry them; its wrapper (S3) only where the inner handle does
                assert {m: hasattr(handle, m) for m in members(group)} == dict.fromkeys(members(group), offered), flag
            finally:
                handle.abort()


def test_a_capability_gated_call_does_what_it_says_or_is_refused_leaving_nothing(backend, tmp_path):
    """fsync_dir needs `fsync`, a handle's write_at and truncate `seekable_write`: where the flag is
    True the call does its work (bytes read back from disk, one fsync event for the folder), where
    it is False it raises io.UnsupportedOperation, records nothing and leaves no object."""
    folder = str(tmp_path / "store" / "gated")
    backend.makedirs(folder)
    view = traced(backend)
    if backend.capabilities.fsync:
        view.fsync_dir(folder)
        events = view.recorder.array()
        assert events["op"].tolist() == [OP_CODE["fsync"]] and view.recorder.paths[events["file"][0]] == folder
    else:
        with pytest.raises(io.UnsupportedOperation):
            view.fsync_dir(folder)
        assert view.recorder.array().size == 0  # nothing recorded for a call that did not happen
    handle = view.open_write(f"{folder}/in_place.bin")
    handle.write(b"abcdef")
    if backend.capabilities.seekable_write:
        assert handle.write_at(b"XY", 2) == 2 and handle.tell() == 6  # in place, the position unchanged
        assert handle.truncate(5) == 5
        handle.close()
        assert Path(folder, "in_place.bin").read_bytes() == b"abXYe"
    else:
        with pytest.raises(io.UnsupportedOperation):
            handle.write_at(b"XY", 2)
        with pytest.raises(io.UnsupportedOperation):
            handle.truncate(5)
        handle.abort()
        assert not backend.exists(f"{folder}/in_place.bin")


def test_each_backend_declares_its_options_table_and_the_config_points_at_it():
    sections = yaml.safe_load(CONFIG_YAML.read_text())["storage"]
    hints = typing.get_type_hints(StorageConfig)
    tables = {}
    for name in NAMES:
        cls = backend_class(name)
        assert cls.name == name and hasattr(cls, "options"), name
        if cls.options is None:
            assert name not in hints and name not in sections, name
            continue
        tables[name] = cls.options
        assert hints[name] is cls.options, name
        assert sorted(sections[name]) == sorted(f.name for f in dataclasses.fields(cls.options)), name
    # every backend-specific section of StorageConfig is a backend's own table: none left in config/
    assert {key: hint for key, hint in hints.items() if dataclasses.is_dataclass(hint)} == tables


@pytest.mark.parametrize("override, message", [
    ("storage.s3.bucet=x", "unknown config key 'storage.s3.bucet' (did you mean 'storage.s3.bucket'?); keys under "
                           "storage.s3: addressing_style, bucket, concurrency, endpoint_url, part_size, prefix, region"),
    ("storage.s3.part_size=1MiB", "storage.s3.part_size: S3 multipart parts are 5MiB to 5GiB (got 1048576)"),
    ("storage.s3.concurrency=0", "storage.s3.concurrency: must be at least 1 (got 0)"),
    ("storage.posix.x=1", "unknown config key 'storage.posix.x' (did you mean 'storage.s3'?); see `dlio_ckpt --cfg job` "
                          "for every key"),
])
def test_a_bad_option_of_a_backend_is_refused_by_its_table_in_one_line(override, message):
    with pytest.raises(ConfigError) as error:
        validate_command_line([override], multirun=False, world_size=1)
    assert str(error.value) == message


def test_an_unknown_option_of_a_backend_exits_2_with_one_line_and_nothing_written(workdir):
    done = run_cli(["scale=tiny", "storage.s3.bucet=x", f"storage.root={workdir / 'store'}"], workdir / "cwd")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert lines == ["dlio_ckpt: error: unknown config key 'storage.s3.bucet' (did you mean 'storage.s3.bucket'?); keys "
                     "under storage.s3: addressing_style, bucket, concurrency, endpoint_url, part_size, prefix, region"]
    assert list((workdir / "cwd").iterdir()) == [] and not (workdir / "store").exists()


def _backend_mentions(tree: ast.AST, names: set[str], modules: set[str]) -> list[str]:
    """Imports of a backend's module and comparisons with a backend's name, as 'line: text'."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            found.append(f"{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Compare):
            constants = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in names]
            found.extend(f"{node.lineno}: compares with '{c.value}'" for c in constants)
    return found


def test_no_module_outside_storage_names_a_backend():
    modules = {target.split(":")[0] for target in BACKENDS.entries.values()}
    found = {}
    for source in sorted(PACKAGE.rglob("*.py")):
        relative = source.relative_to(PACKAGE)
        if relative.parts[0] == "storage":
            continue
        mentions = _backend_mentions(ast.parse(source.read_text()), set(NAMES), modules)
        if mentions:
            found[str(relative)] = mentions
    assert found == {}
