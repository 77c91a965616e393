"""Which hooks run without a span: plumbing forwarded as vLLM's base class declares it, the no-ops
a wrapped connector keeps, and a quiet step's per-step hooks."""

import pytest
from vllm.config import VllmConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)

from kvscope.connector.traced import TracedConnector
from kvscope.traces import names
from kvscope.traces.forwarding import ANSWERED_BY_WRAPPER, declared_api, left_to_vllm
from kvscope.traces.instrumented import FORWARDED, NO_OP_BY_DEFAULT
from kvscope.traces.metadata import TracedMetadata
from kvscope.traces.worker_hooks import STEP_HOOKS

MODULE = __name__


class ReportsPreemptions(ExampleConnector):
    def handle_preemptions(self, kv_connector_metadata) -> None:
        pass


class CountsCalls(ExampleConnector):
    """ExampleConnector that counts the per-step hooks it gets (the forward itself is empty)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.called: list[str] = []

    def start_load_kv(self, forward_context, **kwargs):
        self.called.append("start_load_kv")

    def wait_for_layer_load(self, layer_name):
        self.called.append("wait_for_layer_load")

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self.called.append("save_kv_layer")

    def wait_for_save(self):
        self.called.append("wait_for_save")

    def get_finished(self, finished_req_ids):
        self.called.append("get_finished")
        return None, None


def traced(inner: str, tmp_path, **extra) -> TracedConnector:
    config = KVTransferConfig(
        kv_connector="TracedConnector",
        kv_connector_module_path="kvscope.connector.traced",
        kv_role="kv_both",
        kv_connector_extra_config={
            "connector": inner,
            "connector_module_path": MODULE,
            "shared_storage_path": str(tmp_path),
            **extra,
        },
    )
    return TracedConnector(VllmConfig(kv_transfer_config=config), KVConnectorRole.WORKER, None)


def test_the_no_ops_a_connector_keeps_run_without_a_span(tmp_path):
    assert traced("ExampleConnector", tmp_path).untraced_hooks() == set(NO_OP_BY_DEFAULT)
    kept = traced("ReportsPreemptions", tmp_path).untraced_hooks()
    assert "handle_preemptions" not in kept and "take_events" in kept
    assert traced("ExampleConnector", tmp_path, trace_quiet_hooks=True).untraced_hooks() == set()


def test_every_instance_member_of_vllms_base_is_traced_or_forwarded():
    """Derived from vLLM's base class: a member vLLM adds is forwarded without a line here."""
    members = [
        name
        for name, member in declared_api(KVConnectorBase_V1).items()
        if member.kind in ("method", "property")
    ]
    left = [n for n in members if left_to_vllm(TracedConnector, n) and n not in ANSWERED_BY_WRAPPER]
    assert left == []
    assert {"get_handshake_metadata", "supports_divergent_local_hybrid_hits"} <= FORWARDED
    assert not FORWARDED & {"start_load_kv", "request_finished", *ANSWERED_BY_WRAPPER}


def run_step(connector: TracedConnector, quiet: bool) -> None:
    connector.bind_connector_metadata(TracedMetadata(ExampleConnectorMetadata(), 1, quiet=quiet))
    connector.start_load_kv(None)
    connector.wait_for_layer_load("model.layers.0.attn")
    connector.save_kv_layer("model.layers.0.attn", None, None)
    connector.wait_for_save()
    connector.get_finished(set())
    connector.clear_connector_metadata()


@pytest.mark.parametrize("quiet", [True, False])
def test_a_quiet_steps_hooks_reach_the_connector_with_no_span(tmp_path, spans, quiet):
    connector = traced("CountsCalls", tmp_path)
    run_step(connector, quiet)
    assert connector.inner.called == [
        "start_load_kv",
        "wait_for_layer_load",
        "save_kv_layer",
        "wait_for_save",
        "get_finished",
    ]
    hooks = {s.attributes.get(names.HOOK) for s in spans() if s.attributes.get(names.HOOK)}
    if quiet:
        assert not hooks & set(STEP_HOOKS)
    else:  # a step with KV work traces them
        assert {"start_load_kv", "wait_for_save", "get_finished"} <= hooks


def test_the_step_after_a_quiet_one_is_traced_again(tmp_path, spans):
    connector = traced("CountsCalls", tmp_path)
    run_step(connector, quiet=True)
    run_step(connector, quiet=False)
    hooks = [s.attributes.get(names.HOOK) for s in spans()]
    assert hooks.count("wait_for_save") == 1
