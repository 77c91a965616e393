"""bench.tracing_switch: one engine runs its TracedConnector off and on, tokens unchanged."""

import pytest

from kvscope.bench.engine.tracing_switch import set_traced, traced_connectors
from kvscope.demo.quickstart import traced_example_config
from kvscope.harness.engine import in_process_llm
from kvscope.harness.oracle import greedy_tokens
from kvscope.harness.prompts import DISTINCT
from kvscope.traces import names

pytestmark = pytest.mark.engine


def hook_spans(span_exporter) -> list:
    from kvscope.traces.sdk.configure import flush

    flush()
    spans = [
        s for s in span_exporter.get_finished_spans() if s.name.startswith(names.SPAN_HOOK_PREFIX)
    ]
    span_exporter.clear()
    return spans


def test_untraced_batches_emit_no_hook_spans_and_the_same_tokens(
    tiny_model, tmp_path, span_exporter
):
    with in_process_llm(tiny_model, traced_example_config(tmp_path)) as llm:
        connectors = traced_connectors(llm)
        assert len(connectors) == 2  # the scheduler's and the worker's
        span_exporter.clear()
        traced = greedy_tokens(llm, DISTINCT)
        assert hook_spans(span_exporter)

        set_traced(connectors, False)
        llm.reset_prefix_cache()  # ExampleConnector serves the prompts from its files now
        untraced = greedy_tokens(llm, DISTINCT)
        assert hook_spans(span_exporter) == []

        set_traced(connectors, True)
        llm.reset_prefix_cache()
        again = greedy_tokens(llm, DISTINCT)
        assert {s.name for s in hook_spans(span_exporter)} >= {
            names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens",
            names.SPAN_HOOK_PREFIX + "start_load_kv",
        }
    assert untraced == traced == again
