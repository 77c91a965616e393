"""Worker-side tracing state: the step span, per-request work spans, per-layer timings."""

import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span

from kvscope.traces import context, names
from kvscope.traces.buffer import Events, add_events, call_buffered, end_step_keeping, keep_for_step
from kvscope.traces.hook_spans import HookSpans, from_headers
from kvscope.traces.metadata import TracedMetadata


@dataclass
class LayerCalls:
    """Per-layer calls of one hook in one step, for the aggregated span."""

    start_ns: int = 0
    end_ns: int = 0
    layers: list[str] = field(default_factory=list)
    durations_ms: list[float] = field(default_factory=list)


class WorkerTracing:
    """Opens a step span per bound metadata and the request spans of that step's KV work."""

    def __init__(self, spans: HookSpans, per_layer: bool) -> None:
        self.spans = spans
        self.per_layer = per_layer
        self.step_span: Span | None = None
        self.step_context: Context | None = None
        self.step_index = -1
        self.request_spans: dict[str, Span] = {}
        self.loading: frozenset[str] = frozenset()
        self.layer_calls: dict[str, LayerCalls] = {}
        self.quiet_hooks: list[str] = []
        self.quiet_steps = 0  # steps without KV work since the last traced one
        self.quiet_start_ns = 0
        self.quiet_events: list | None = None  # what a quiet step's connector reports

    def begin_step(self, metadata: TracedMetadata) -> None:
        if self.step_span is not None or self.quiet_events is not None:
            self.end_step()  # a call less in a decode step, where nothing is open
        self.step_index = metadata.step
        self.loading = metadata.reqs_to_load
        if metadata.quiet:
            self.quiet_steps += 1
            if self.spans.reports:
                self.quiet_start_ns = time.time_ns()
                self.quiet_events = keep_for_step()
            return
        for req_id, traceparent in metadata.reqs_trace_context.items():
            context.remember(req_id, traceparent)
        links = []
        for req_id, traceparent in metadata.reqs_trace_context.items():
            parent = from_headers({"traceparent": traceparent})
            span = self.spans.start(
                names.SPAN_WORKER_REQUEST,
                parent,
                start_time=None,  # named: the attributes' ** would fill it, for the checker
                **{
                    names.REQUEST_ID: req_id,
                    names.STEP: metadata.step,
                    names.LOAD_THIS_STEP: req_id in self.loading,
                },
            )
            self.request_spans[req_id] = span
            links.append(Link(span.get_span_context(), {names.REQUEST_ID: req_id}))
        self.step_span = self.spans.start(
            names.SPAN_STEP,
            None,
            links,
            **{names.STEP: metadata.step, names.STEP_QUIET_BEFORE: self.quiet_steps},
        )
        self.quiet_steps = 0
        self.step_context = trace.set_span_in_context(self.step_span)

    def call_in_step(self, call, *args: Any) -> tuple[Any, Events]:
        """Runs a per-step query; returns (its result, the events it reported outside a span).

        In a traced step the step span is current, so the connector's facts land on it; in a
        quiet step they are kept for the caller to give a span of their own.
        """
        if not self.spans.reports:
            return call(*args), ()
        if self.step_context is None:
            return call_buffered(call, *args)
        token = otel_context.attach(self.step_context)
        try:
            return call_buffered(call, *args)
        finally:
            otel_context.detach(token)

    def note_quiet(self, hook: str) -> None:
        """A hook that did nothing worth a span: named on the step span of a traced step (a
        quiet step has none, and keeping names for the next traced one would grow without
        bound through a long decode)."""
        if self.step_span is not None:
            self.quiet_hooks.append(hook)

    def timeline(self, point: str, req_ids, **attributes) -> None:
        """Adds a timeline event to the step's span of each request in req_ids."""
        for req_id in req_ids:
            span = self.request_spans.get(req_id)
            if span is not None:
                span.add_event(names.EVENT_TIMELINE, {names.TIMELINE_POINT: point, **attributes})

    def layer_call(self, hook: str, layer_name: str, start_ns: int, end_ns: int) -> None:
        calls = self.layer_calls.get(hook)
        if calls is None:
            if not self.layer_calls:  # the step's first per-layer call: the forward has begun
                self.timeline("forward_start", self.request_spans)
            calls = self.layer_calls[hook] = LayerCalls(start_ns=start_ns)
        calls.end_ns = end_ns
        calls.layers.append(layer_name)
        calls.durations_ms.append((end_ns - start_ns) / 1e6)

    def flush_layer_calls(self) -> None:
        """One span per per-layer hook that ran this step, timed from first call to last."""
        for hook, calls in self.layer_calls.items():
            span = self.spans.start(
                names.SPAN_HOOK_PREFIX + hook,
                self.step_context,
                start_time=calls.start_ns,
                **{
                    names.HOOK: hook,
                    names.STEP: self.step_index,
                    names.TRACE_MODE: "aggregated",
                    names.LAYER_COUNT: len(calls.layers),
                    names.LAYER_DURATIONS_MS: calls.durations_ms,
                    names.LAYER_TOTAL_MS: sum(calls.durations_ms),
                },
            )
            span.end(end_time=calls.end_ns)
        self.layer_calls = {}

    def end_step(self) -> None:
        if self.quiet_events is not None:
            self._end_quiet_step()
        if self.step_span is None:
            return
        self.flush_layer_calls()
        for span in self.request_spans.values():
            span.end()
        self.request_spans = {}
        if self.quiet_hooks:
            self.step_span.set_attribute(names.STEP_QUIET_HOOKS, self.quiet_hooks)
            self.quiet_hooks = []
        self.step_span.end()
        self.step_span = self.step_context = None

    def _end_quiet_step(self) -> None:
        """A quiet step whose connector reported facts (a lease expired, a load failed) gets
        its step span after all, with the facts as events."""
        events, self.quiet_events = self.quiet_events, None
        end_step_keeping()
        if not events:
            return
        span = self.spans.start(
            names.SPAN_STEP,
            None,
            start_time=self.quiet_start_ns,
            **{names.STEP: self.step_index, names.STEP_QUIET_BEFORE: self.quiet_steps - 1},
        )
        self.quiet_steps = 0
        add_events(span, events)
        span.end()
