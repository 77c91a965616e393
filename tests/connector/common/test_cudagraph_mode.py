"""requires_piecewise_for_cudagraph, asked as vLLM asks it (the connector factory's class,
the kv_connector_extra_config): True only where FULL CUDA graphs would skip per-layer work
a connector or a user needs. Needs vLLM (skipped without it)."""

import pytest

pytest.importorskip("vllm")

from vllm.config.kv_transfer import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402

OFFLOAD = {
    "kv_connector": "CpuOffloadConnector",
    "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
}
P2P = {
    "kv_connector": "P2PConnector",
    "kv_connector_module_path": "kvscope.connector.p2p.connector",
}
LAYERWISE = {
    "kv_connector": "LayerwiseConnector",
    "kv_connector_module_path": "tests.connector.common.layerwise_connector",
}
EXAMPLE = {"kv_connector": "ExampleConnector"}


def asks_piecewise(connector: dict, extra: dict) -> bool:
    """vLLM's own question (VllmConfig.__post_init__, with FULL CUDA graphs configured)."""
    config = KVTransferConfig(**connector, kv_role="kv_both", kv_connector_extra_config=extra)
    connector_class = KVConnectorFactory.get_connector_class(config)
    return connector_class.requires_piecewise_for_cudagraph(config.kv_connector_extra_config)


def multi(*children: dict, **extra) -> tuple[dict, dict]:
    connector = {
        "kv_connector": "KvscopeMultiConnector",
        "kv_connector_module_path": "kvscope.connector.multi.connector",
    }
    return connector, {"connectors": list(children), **extra}


def traced(inner: dict, **extra) -> tuple[dict, dict]:
    connector = {
        "kv_connector": "TracedConnector",
        "kv_connector_module_path": "kvscope.connector.traced",
    }
    own = {
        "connector": inner["kv_connector"],
        "connector_module_path": inner.get("kv_connector_module_path"),
    }
    return connector, {**own, **extra}


def test_kvscope_connectors_do_nothing_per_layer(monkeypatch):
    monkeypatch.delenv("KVSCOPE_LAYER_SPANS", raising=False)
    assert not asks_piecewise(OFFLOAD, {})
    assert not asks_piecewise(P2P, {"side_channel_port": 5700})
    assert not asks_piecewise(*multi(OFFLOAD, {**P2P, "kv_connector_extra_config": {}}))


def test_per_layer_spans_need_piecewise_graphs(monkeypatch):
    monkeypatch.delenv("KVSCOPE_LAYER_SPANS", raising=False)
    assert asks_piecewise(OFFLOAD, {"trace_layer_mode": "per_layer"})
    assert not asks_piecewise(OFFLOAD, {"trace_layer_mode": "aggregated"})
    assert asks_piecewise(*multi(OFFLOAD, trace_layer_mode="per_layer"))
    monkeypatch.setenv("KVSCOPE_LAYER_SPANS", "per_layer")  # the same switch, engine-wide
    assert asks_piecewise(OFFLOAD, {})


def test_a_wrapper_answers_for_the_connector_it_wraps(monkeypatch):
    monkeypatch.delenv("KVSCOPE_LAYER_SPANS", raising=False)
    assert asks_piecewise(*traced(LAYERWISE, use_layerwise=True))
    assert not asks_piecewise(*traced(LAYERWISE, use_layerwise=False))
    assert not asks_piecewise(*traced(EXAMPLE, shared_storage_path="/tmp/kv"))


def test_the_multi_asks_piecewise_when_any_child_does(monkeypatch):
    monkeypatch.delenv("KVSCOPE_LAYER_SPANS", raising=False)
    layerwise = {**LAYERWISE, "kv_connector_extra_config": {"use_layerwise": True}}
    assert asks_piecewise(*multi(OFFLOAD, layerwise))
    assert not asks_piecewise(*multi(OFFLOAD, {**LAYERWISE, "kv_connector_extra_config": {}}))
    # The Multi builds its children untraced: a child's span mode asks for nothing.
    per_layer_child = {**OFFLOAD, "kv_connector_extra_config": {"trace_layer_mode": "per_layer"}}
    assert not asks_piecewise(*multi(per_layer_child, EXAMPLE))
