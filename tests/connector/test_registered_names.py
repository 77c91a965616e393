"""kvscope's connectors by registered name through vLLM's general plugins, no module path."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvscope.connector import plugin
from kvscope.connector.cpu_offload.connector import CpuOffloadConnector
from kvscope.connector.cpu_offload.core import CpuOffloadCore
from kvscope.connector.multi.children import child_configs, configured_class
from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.traced import TracedConnector
from kvscope.harness import configs
from kvscope.harness.engine import engine_env, in_process_llm
from kvscope.harness.engine_state import engine_scheduler, leaked_device_blocks, worker_connector
from kvscope.harness.oracle import greedy_tokens, token_mismatches
from kvscope.harness.prompts import DISTINCT
from kvscope.verify.connectors import add_fault_paths, parse_connector
from tests.oracle_cache import prompt_set
from tests.stepping import step_until_prefix_cache_reset

BASELINE = prompt_set(DISTINCT)
ENTRY_POINT = "kvscope = kvscope.connector.plugin:register"
"""The line pyproject.toml's [project.entry-points."vllm.general_plugins"] holds."""


def plugin_dist(folder: Path) -> Path:
    """A folder holding a distribution whose only content is kvscope's entry point: on
    sys.path, importlib.metadata (so vLLM) finds it as it finds an installed kvscope's."""
    dist = folder / "kvscope_plugin_check-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: kvscope-plugin-check\nVersion: 0.0\n"
    )
    (dist / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{ENTRY_POINT}\n")
    return folder


def without_kvscope_names() -> dict:
    """vLLM's factory registry as vLLM alone fills it."""
    registry = KVConnectorFactory._registry
    return {name: load for name, load in registry.items() if name not in plugin.CONNECTORS}


@pytest.fixture
def unregistered(monkeypatch, tmp_path):
    """This process as vLLM finds a fresh one: kvscope's names not registered, general plugins
    not loaded yet, and kvscope's entry point on sys.path; all restored afterwards."""
    import vllm.plugins

    registry = without_kvscope_names()
    monkeypatch.setattr(KVConnectorFactory, "_registry", registry)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    monkeypatch.syspath_prepend(str(plugin_dist(tmp_path / "plugin")))
    return registry


@pytest.fixture
def registered():
    plugin.register()


@pytest.fixture(scope="module")
def expected(oracle):
    return oracle.tokens(BASELINE)


def two_passes(llm) -> tuple[list[list[int]], list[list[int]]]:
    """Stores on the first pass; the second, after a prefix cache reset, loads."""
    first = greedy_tokens(llm, DISTINCT)
    step_until_prefix_cache_reset(llm)  # asynchronous stores commit meanwhile
    return first, greedy_tokens(llm, DISTINCT)


# --- register() ---------------------------------------------------------------------------


def test_register_twice_and_each_name_loads_its_class(monkeypatch):
    monkeypatch.setattr(KVConnectorFactory, "_registry", without_kvscope_names())
    plugin.register()
    plugin.register()
    assert set(plugin.CONNECTORS) <= set(KVConnectorFactory._registry)
    for name, (module_path, class_name) in plugin.CONNECTORS.items():
        want = getattr(importlib.import_module(module_path), class_name)
        assert KVConnectorFactory.get_connector_class_by_name(name) is want
        config = KVTransferConfig(kv_connector=name, kv_role="kv_both")
        assert config.kv_connector_module_path is None
        assert KVConnectorFactory.get_connector_class(config) is want


def test_a_name_already_there_is_kept_and_a_failure_is_logged_not_raised(monkeypatch, caplog):
    def theirs():
        return CpuOffloadCore

    monkeypatch.setattr(KVConnectorFactory, "_registry", {"KvscopeP2PConnector": theirs})
    plugin.register()
    assert KVConnectorFactory._registry["KvscopeP2PConnector"] is theirs
    assert set(plugin.CONNECTORS) <= set(KVConnectorFactory._registry)

    def refuse(*args):
        raise RuntimeError("factory closed")

    monkeypatch.setattr(KVConnectorFactory, "_registry", {})
    monkeypatch.setattr(KVConnectorFactory, "register_connector", refuse)
    plugin.register()  # never raises into vLLM
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == len(plugin.CONNECTORS) and "not registered" in warned[0]


SUBPROCESS = """
import json, os, sys
import vllm.plugins
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory as F
from kvscope.connector.plugin import CONNECTORS
from importlib.metadata import entry_points
out = {"found": sorted(e.dist.name for e in entry_points(group="vllm.general_plugins")
                       if e.name == "kvscope")}
os.environ["VLLM_PLUGINS"] = "lora_filesystem_resolver"
vllm.plugins.load_general_plugins()
out["filtered_out"] = sorted(n for n in CONNECTORS if n in F._registry)
del os.environ["VLLM_PLUGINS"]
vllm.plugins.plugins_loaded = False
vllm.plugins.load_general_plugins()
vllm.plugins.plugins_loaded = False
vllm.plugins.load_general_plugins()
out["registered"] = sorted(n for n in CONNECTORS if n in F._registry)
out["imported"] = sorted(m for m in sys.modules if m.startswith("kvscope."))
out["classes"] = {n: [F.get_connector_class_by_name(n).__module__,
                      F.get_connector_class_by_name(n).__name__] for n in CONNECTORS}
print("RESULT " + json.dumps(out))
"""


def test_vllm_loads_the_entry_point_in_a_fresh_process_lazily(tmp_path):
    """vllm.plugins.load_general_plugins, as the engine core, each worker and the front end
    call it, finds the entry point, honours VLLM_PLUGINS, and imports no connector module."""
    folder = plugin_dist(tmp_path)
    pythonpath = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = engine_env(PYTHONPATH=pythonpath)
    env.pop("VLLM_PLUGINS", None)
    done = subprocess.run(
        [sys.executable, "-c", SUBPROCESS],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    assert "kvscope-plugin-check" in out["found"]
    assert out["filtered_out"] == [], "VLLM_PLUGINS without kvscope loads none of its names"
    assert out["registered"] == sorted(plugin.CONNECTORS)
    assert out["imported"] == ["kvscope.connector", "kvscope.connector.plugin"]
    assert out["classes"] == {n: list(target) for n, target in plugin.CONNECTORS.items()}


# --- configs and kvscope's own readers of connector names ----------------------------------


def test_children_by_registered_name_resolve_where_no_plugin_was_loaded(monkeypatch):
    monkeypatch.setattr(KVConnectorFactory, "_registry", without_kvscope_names())
    outer = KVTransferConfig(**configs.multi_config(configs.offload_child(registered=True)))
    (child,) = child_configs(outer.kv_connector_extra_config, outer.kv_role)
    assert "kv_connector_module_path" not in child
    assert configured_class(child, outer) is CpuOffloadConnector
    assert TracedConnector.inner_class({"connector": "KvscopeCpuOffloadConnector"}) is (
        CpuOffloadConnector
    )


def test_traced_refuses_to_wrap_itself_by_its_registered_name(registered):
    with pytest.raises(ValueError, match="cannot wrap itself"):
        TracedConnector.inner_class({"connector": "KvscopeTracedConnector"})


def test_verify_takes_a_registered_name_and_finds_an_offload_child_by_name(tmp_path):
    spec = parse_connector("KvscopeCpuOffloadConnector", {"cpu_bytes_to_use": 1 << 20})
    assert (spec.name, spec.module_path) == (configs.OFFLOAD_CLASS, configs.OFFLOAD_MODULE)
    multi = parse_connector(
        "KvscopeMultiConnector", {"connectors": [configs.offload_child(registered=True)]}
    )
    (child,) = add_fault_paths(multi, str(tmp_path)).extra_config["connectors"]
    assert child["kv_connector_extra_config"]["faults_path"] == f"{tmp_path}/faults-0.json"


# --- engines ------------------------------------------------------------------------------


@pytest.mark.engine
def test_an_engine_loads_the_offload_connector_by_name_through_the_plugin(
    tiny_model, expected, unregistered
):
    config = configs.offload_config(registered=True)
    assert config["kv_connector"] == "KvscopeCpuOffloadConnector"
    assert "kv_connector_module_path" not in config
    assert not set(plugin.CONNECTORS) & set(unregistered)
    with in_process_llm(tiny_model, config) as llm:
        # LLM() built EngineArgs, which loaded the general plugins: our entry point.
        assert set(plugin.CONNECTORS) <= set(unregistered)
        transfer = llm.llm_engine.vllm_config.kv_transfer_config
        assert transfer.kv_connector_module_path is None
        scheduler_side = engine_scheduler(llm).connector
        assert type(scheduler_side) is CpuOffloadConnector
        assert type(worker_connector(llm, unwrap=False)) is CpuOffloadConnector
        first, second = two_passes(llm)
        stats = scheduler_side.inner.scheduler.stats
        assert leaked_device_blocks(llm) == 0
    assert token_mismatches(expected, first) == []
    assert token_mismatches(expected, second) == []
    assert stats["hit_tokens"] >= 64 * len(DISTINCT)
    assert stats["loaded_blocks"] >= 2 * len(DISTINCT)


@pytest.mark.engine
def test_a_multi_by_name_over_an_offload_child_by_name(tiny_model, expected, registered):
    config = configs.multi_config(configs.offload_child(registered=True), registered=True)
    assert config["kv_connector"] == "KvscopeMultiConnector"
    with in_process_llm(tiny_model, config) as llm:
        multi = engine_scheduler(llm).connector
        assert type(multi) is KvscopeMultiConnector
        (child,) = multi.inner.children
        assert child.name == "offload" and type(child.connector) is CpuOffloadCore
        _, second = two_passes(llm)
        stats = child.connector.scheduler.stats
        assert leaked_device_blocks(llm) == 0
    assert token_mismatches(expected, second) == []
    assert stats["loaded_blocks"] >= 2 * len(DISTINCT)


@pytest.mark.engine
def test_traced_by_name_wraps_the_offload_connector_by_name(tiny_model, expected, registered):
    traced = configs.traced_child(
        "KvscopeCpuOffloadConnector", registered=True, cpu_bytes_to_use=configs.OFFLOAD_BYTES
    )
    config = configs.engine_config(traced)
    assert config["kv_connector"] == "KvscopeTracedConnector"
    with in_process_llm(tiny_model, config) as llm:
        connector = engine_scheduler(llm).connector
        assert type(connector) is TracedConnector
        assert type(connector.inner) is CpuOffloadConnector
        _, second = two_passes(llm)
        stats = connector.inner.inner.scheduler.stats
        assert leaked_device_blocks(llm) == 0
    assert token_mismatches(expected, second) == []
    assert stats["loaded_blocks"] >= 2 * len(DISTINCT)
