"""vLLM's checks that find stock connectors by name or by walking a MultiConnector's children,
asked with vLLM's own functions: what wrapping loses, and the config that keeps them."""

import pytest
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import simple_cpu_offload_connector
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.harness.engine import in_process_llm
from kvscope.harness.oracle import greedy_tokens, token_mismatches
from kvscope.harness.prompts import DISTINCT
from tests.conformance.recording import MODULE, RECORDING
from tests.conformance.wrappers import build, vllm_config
from tests.oracle_cache import prompt_set

MULTI_PATH = "kvscope.connector.multi.connector"
# Children in vLLM's own format (no name: vLLM's MultiConnector parses each as a KVTransferConfig).
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
OFFLOAD = {
    "kv_connector": "CpuOffloadConnector",
    "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"cpu_bytes_to_use": 64 << 20},
}
BASELINE = prompt_set(DISTINCT)


def find_simple_cpu_offload_connector(connector):
    """vLLM 0.33's _find_simple_cpu_offload_connector (its engine core aligns the CPU pools of
    all ranks with the answer); vLLM 0.32 has none, so there its 0.33 text, verbatim."""
    find = getattr(simple_cpu_offload_connector, "_find_simple_cpu_offload_connector", None)
    if find is not None:
        return find(connector)
    if isinstance(connector, simple_cpu_offload_connector.SimpleCPUOffloadConnector):
        return connector
    child_connectors = getattr(connector, "_connectors", None)
    if child_connectors:
        for child in child_connectors:
            found = find_simple_cpu_offload_connector(child)
            if found is not None:
                return found
    return None


def as_multi_connector(*children: dict) -> KVTransferConfig:
    """kvscope's Multi under the name vLLM's checks look for."""
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_connector_module_path=MULTI_PATH,
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": list(children)},
    )


def vllms_multi_connector(*children: dict) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="MultiConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": list(children)},
    )


@pytest.mark.parametrize("wrapper", ["traced", "multi"])
def test_vllm_finds_a_simple_cpu_offload_connector_inside_either_wrapper(wrapper):
    """What vLLM's engine core asks the workers to align the CPU pool across ranks."""
    connector, inner = build(wrapper, "SimpleCPUOffloadConnector")
    found = find_simple_cpu_offload_connector(connector)
    # The traced wrapper answers isinstance as the connector it wraps and forwards what is
    # asked next; the Multi is walked to its child.
    assert found is (connector if wrapper == "traced" else inner)
    if hasattr(inner, "get_aligned_num_cpu_blocks"):  # vLLM 0.33 and later: asked next
        assert found.get_aligned_num_cpu_blocks.__self__ is inner


def test_the_multi_under_vllms_name_is_kvscopes_and_its_children_are_seen():
    config = as_multi_connector(NIXL, OFFLOAD)
    assert KVConnectorFactory.get_connector_class(config) is KvscopeMultiConnector
    assert config.has_connector("NixlConnector")
    assert config.has_connector("CpuOffloadConnector")


def test_vllm_asks_its_children_about_the_hybrid_kv_cache_manager_as_for_its_own_multi():
    ours, vllms = as_multi_connector(NIXL, OFFLOAD), vllms_multi_connector(NIXL, OFFLOAD)
    assert KVConnectorFactory.supports_hma_config(ours) is True
    assert KVConnectorFactory.supports_hma_config(ours) == KVConnectorFactory.supports_hma_config(
        vllms
    )
    example = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}  # not SupportsHMA
    assert KVConnectorFactory.supports_hma_config(as_multi_connector(NIXL, example)) is False


def test_wrapped_by_name_a_stock_connector_is_not_seen():
    """What TracedConnector loses (the vLLM versions page: 'What vLLM checks by connector name')."""
    traced = KVTransferConfig(
        kv_connector="TracedConnector",
        kv_connector_module_path="kvscope.connector.traced",
        kv_role="kv_both",
        kv_connector_extra_config={"connector": "NixlConnector"},
    )
    assert not traced.has_connector("NixlConnector")
    assert as_multi_connector(NIXL).has_connector("NixlConnector")


def test_the_multi_under_vllms_name_builds_its_children():
    child = {
        "kv_connector": RECORDING["NixlConnector"].__name__,
        "kv_connector_module_path": MODULE,
        "kv_role": "kv_both",
    }
    connector = KvscopeMultiConnector(
        vllm_config(as_multi_connector(child)), KVConnectorRole.WORKER, None
    )
    assert [type(c.connector) for c in connector.inner.children] == [RECORDING["NixlConnector"]]


@pytest.mark.engine
def test_an_engine_runs_the_multi_under_vllms_name(tiny_model, oracle):
    expected = oracle.tokens(BASELINE)
    config = {
        "kv_connector": "MultiConnector",
        "kv_connector_module_path": MULTI_PATH,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"connectors": [OFFLOAD]},
    }
    with in_process_llm(tiny_model, config) as llm:
        assert token_mismatches(expected, greedy_tokens(llm, DISTINCT)) == []
        assert llm.llm_engine.vllm_config.kv_transfer_config.has_connector("CpuOffloadConnector")
