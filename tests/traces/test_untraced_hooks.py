"""Which hooks vLLM calls on the wrapped connector directly: nothing to trace in them."""

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

from kvscope.connector.traced import TracedConnector
from kvscope.traces.instrumented import NO_OP_BY_DEFAULT, PASS_THROUGH


class ReportsPreemptions(ExampleConnector):
    def handle_preemptions(self, kv_connector_metadata) -> None:
        pass


def _traced(inner_class, trace_quiet_hooks=False) -> TracedConnector:
    connector = object.__new__(TracedConnector)  # the hooks' choice needs no engine
    connector._inner = object.__new__(inner_class)
    connector._trace_quiet_hooks = trace_quiet_hooks
    return connector


def test_plumbing_and_the_no_ops_a_connector_keeps_go_to_it_directly():
    connector = _traced(ExampleConnector)
    direct = connector.untraced_hooks()
    assert set(direct) == set(PASS_THROUGH) | set(NO_OP_BY_DEFAULT)
    assert direct["take_events"] == connector._inner.take_events  # its bound method


def test_a_hook_the_connector_implements_stays_traced():
    direct = _traced(ReportsPreemptions).untraced_hooks()
    assert "handle_preemptions" not in direct and "take_events" in direct


def test_trace_quiet_hooks_traces_the_no_ops_too():
    assert set(_traced(ExampleConnector, trace_quiet_hooks=True).untraced_hooks()) == set(
        PASS_THROUGH
    )
