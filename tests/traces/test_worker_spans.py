"""WorkerTracing without an engine: what quiet steps keep, what a traced step's span says."""

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvscope.traces import names
from kvscope.traces.facts import add_event
from kvscope.traces.hook_spans import HookSpans
from kvscope.traces.metadata import TracedMetadata
from kvscope.traces.worker_spans import WorkerTracing

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _worker_tracing(connector_name: str) -> tuple[WorkerTracing, InMemorySpanExporter]:
    """A connector's worker-side tracing, its spans kept in memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    spans = HookSpans(connector_name, "worker", "engine-0", "kv_both")
    spans.tracer = provider.get_tracer("test")
    return WorkerTracing(spans, per_layer=False), memory


def test_quiet_steps_keep_no_hook_names_and_a_traced_step_names_its_own():
    work, memory = _worker_tracing("ExampleConnector")
    for step in range(10_000):  # a long decode: every hook quiet, every step quiet
        work.begin_step(TracedMetadata(None, step, quiet=True))
        work.note_quiet("get_transfer_results")
        work.note_quiet("get_kv_connector_stats")
    assert work.quiet_hooks == []
    work.begin_step(TracedMetadata(None, 10_000, {"req-1": TRACEPARENT}))
    work.note_quiet("wait_for_save")
    work.end_step()
    [step] = [s for s in memory.get_finished_spans() if s.name == names.SPAN_STEP]
    assert step.attributes[names.STEP_QUIET_BEFORE] == 10_000
    assert list(step.attributes[names.STEP_QUIET_HOOKS]) == ["wait_for_save"]


def test_a_quiet_step_whose_connector_reports_a_fact_gets_its_step_span():
    work, memory = _worker_tracing("CpuOffloadConnector")
    work.begin_step(TracedMetadata(None, 1, quiet=True))
    work.end_step()  # nothing reported: no span
    work.begin_step(TracedMetadata(None, 2, quiet=True))
    fact = {names.REQUEST_ID: "req-1", names.FAILURE_CAUSE: "timeout"}
    add_event(names.EVENT_LOAD_FAILED, **fact)
    work.end_step()
    add_event(names.EVENT_LOAD_FAILED, **{names.REQUEST_ID: "req-2"})  # outside a step: dropped
    [step] = memory.get_finished_spans()
    assert step.name == names.SPAN_STEP and step.attributes[names.STEP] == 2
    assert step.attributes[names.STEP_QUIET_BEFORE] == 1
    [event] = step.events
    assert event.name == names.EVENT_LOAD_FAILED and event.attributes[names.REQUEST_ID] == "req-1"
