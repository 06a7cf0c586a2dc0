"""The one registry helper: lazy import, close matches, aliases and install hints, and that every
config name table of the project is one of these registries."""

from __future__ import annotations

import sys

import pytest

from dlio_ckpt.checkpoint.registry import STRATEGIES
from dlio_ckpt.codec_registry import CODECS
from dlio_ckpt.config.load import load_config
from dlio_ckpt.errors import ConfigError, MissingDependency
from dlio_ckpt.formats import DATASET_FORMATS
from dlio_ckpt.plan.checkpoint_formats import CHECKPOINT_FORMATS
from dlio_ckpt.plan.layouts import LAYOUTS
from dlio_ckpt.registry import Registry
from dlio_ckpt.storage import BACKENDS

ALL = [BACKENDS, DATASET_FORMATS, CHECKPOINT_FORMATS, LAYOUTS, STRATEGIES, CODECS]


def test_unknown_name_names_the_key_a_close_match_and_the_choices():
    registry = Registry(key="thing.kind", noun="kind", entries={"alpha": "json:dumps", "beta": "json:loads"})
    with pytest.raises(ConfigError) as caught:
        registry.canonical("alpah")
    assert str(caught.value) == "thing.kind: unknown kind 'alpah' (did you mean 'alpha'?); choose one of: alpha, beta"


def test_load_imports_only_on_use_and_resolves_aliases():
    import json

    registry = Registry(key="k", noun="n", entries={"dump": "json:dumps"}, aliases={"old": "dump"})
    assert registry.load("old") is json.dumps and registry.names() == ["dump"]


def test_a_missing_optional_module_gets_the_install_hint():
    registry = Registry(key="storage.backend", noun="backend", entries={"far": "dlio_ckpt_no_such_module:Far"},
                        install_hints={"far": "pip install 'dlio_ckpt[far]'"})
    with pytest.raises(MissingDependency, match=r"storage.backend=far needs a library .* install it with: pip install 'dlio_ckpt\[far\]'"):
        registry.load("far")


def test_a_missing_module_without_a_hint_is_a_bug_and_keeps_its_traceback():
    registry = Registry(key="k", noun="n", entries={"x": "dlio_ckpt_no_such_module:X"})
    with pytest.raises(ModuleNotFoundError):
        registry.load("x")


@pytest.mark.parametrize("registry", ALL, ids=lambda r: r.key)
def test_every_entry_of_every_registry_loads(registry):
    for name in registry.names():
        if name in registry.install_hints:
            continue  # an optional dependency (the s3 backend): checked by its own tests
        assert registry.load(name) is not None


def test_choosing_a_layout_does_not_import_the_checkpoint_writers():
    """Plans are pure: naming files must not pull in the strategies (threads, MPI) or h5py."""
    for module in [m for m in sys.modules if m.startswith("dlio_ckpt.checkpoint.strategies")]:
        del sys.modules[module]
    LAYOUTS.load("deepspeed")
    assert "dlio_ckpt.checkpoint.strategies" not in sys.modules


@pytest.mark.parametrize(
    "override,message",
    [
        ("checkpoint.strategy=shardd", "checkpoint.strategy: unknown strategy 'shardd' (did you mean 'sharded'?)"),
        ("checkpoint.layout=deepspeeed", "checkpoint.layout: unknown layout 'deepspeeed' (did you mean 'deepspeed'?)"),
        ("checkpoint.format=tourch", "checkpoint.format: unknown format 'tourch' (did you mean 'torch'?)"),
        ("dataset.format=npzz", "dataset.format: unknown format 'npzz' (did you mean 'npz'?)"),
        ("storage.backend=posixx", "storage.backend: unknown backend 'posixx' (did you mean 'posix'?)"),
    ],
)
def test_config_names_are_checked_by_the_registries(override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(["checkpoint.enabled=true", override])
    assert str(caught.value).startswith(message)


def test_the_sync_alias_still_means_sharded():
    config = load_config(["checkpoint.strategy=sync"])
    assert STRATEGIES.canonical(config.checkpoint.strategy) == "sharded"


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["dataset.format=npz", "dataset.compression=lzf"], "dataset.compression: 'lzf' is not offered by dataset.format=npz; choose one of: none, gzip"),
        (["dataset.format=raw", "dataset.compression=gzip"], "dataset.compression: 'gzip' is not offered by dataset.format=raw; choose one of: none"),
        (["dataset.format=npz", "dataset.compression=zstd"], "dataset.compression: 'zstd' is not offered"),
    ],
)
def test_a_format_states_the_compressions_it_offers(overrides, message):
    with pytest.raises(ConfigError) as caught:
        load_config(overrides)
    assert str(caught.value).startswith(message)
    load_config(["dataset.format=hdf5", "dataset.compression=lzf"])


def _install_fake_plugin(root, entry_points: str, modules: dict[str, str]) -> None:
    """What `pip install` leaves for a package with entry points: a dist-info folder (METADATA,
    entry_points.txt) beside its modules, found once `root` is on sys.path."""
    info = root / "toy_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points)
    for name, text in modules.items():
        (root / f"{name}.py").write_text(text)


def test_a_plugin_name_is_offered_matched_and_imported_only_on_use(tmp_path, monkeypatch):
    _install_fake_plugin(tmp_path, "[thing.group]\ngamma = toy_gamma_module:GAMMA\nalpha = toy_gamma_module:OTHER\n",
                         {"toy_gamma_module": "GAMMA = 'gamma from a plugin'\nOTHER = 'not the built-in'\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry(key="thing.kind", noun="kind", entries={"alpha": "json:dumps"}, group="thing.group")
    assert registry.names() == ["alpha", "gamma"]
    assert registry.canonical("gamma") == "gamma" and "toy_gamma_module" not in sys.modules
    assert registry.load("gamma") == "gamma from a plugin"
    import json

    assert registry.load("alpha") is json.dumps  # a plugin cannot take over a built-in name
    with pytest.raises(ConfigError) as caught:
        registry.canonical("gamm")
    assert str(caught.value) == "thing.kind: unknown kind 'gamm' (did you mean 'gamma'?); choose one of: alpha, gamma"
    del sys.modules["toy_gamma_module"]


def test_a_plugin_missing_its_dependency_is_told_to_reinstall_its_package(tmp_path, monkeypatch):
    _install_fake_plugin(tmp_path, "[thing.group]\nfar = toy_far_module:Far\n", {"toy_far_module": "import dlio_ckpt_no_such_module\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry(key="thing.kind", noun="kind", entries={}, group="thing.group")
    with pytest.raises(MissingDependency, match=r"^thing.kind=far needs a library that is not installed .*; install it with: pip install toy-plugin$"):
        registry.load("far")


def test_a_closed_registry_ignores_entry_points(tmp_path, monkeypatch):
    _install_fake_plugin(tmp_path, "[thing.group]\ngamma = json:dumps\n", {})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="unknown kind 'gamma'"):
        Registry(key="thing.kind", noun="kind", entries={"alpha": "json:dumps"}).canonical("gamma")


def test_the_project_registries_are_open_under_their_documented_groups():
    assert {r.key: r.group for r in ALL} == {
        "storage.backend": "dlio_ckpt.storage_backends", "dataset.format": "dlio_ckpt.dataset_formats",
        "checkpoint.format": "dlio_ckpt.checkpoint_formats", "checkpoint.layout": "",
        "checkpoint.strategy": "dlio_ckpt.strategies", "checkpoint.codecs": "dlio_ckpt.codecs"}


def test_strategies_declare_what_config_engine_and_report_ask_of_them():
    from dlio_ckpt.checkpoint.registry import strategy_declares

    declared = {name: (strategy_declares(name, "persists_in_background"), strategy_declares(name, "gathers_to_one_writer"))
                for name in ["sharded", "sync", "single_writer", "async", "no_such_strategy"]}
    assert declared == {"sharded": (False, False), "sync": (False, False), "single_writer": (False, True),
                        "async": (True, False), "no_such_strategy": (False, False)}
