"""Shared span plumbing for both connector halves: the tracer, base attributes, hook spans."""

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvscope.traces import names

_propagator = TraceContextTextMapPropagator()


def get_tracer() -> trace.Tracer:
    return trace.get_tracer(names.INSTRUMENTATION_NAME)


def to_traceparent(span: Span) -> str | None:
    """The W3C traceparent of a span, for the metadata sent to workers."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get("traceparent")


def from_headers(headers: dict[str, str] | None) -> Context | None:
    """The parent context in W3C headers (a traceparent), or None."""
    if not headers:
        return None
    context = _propagator.extract(carrier=dict(headers))
    return context if trace.get_current_span(context).get_span_context().is_valid else None


class HookSpans:
    """Opens hook spans with the attributes every span of one connector half carries."""

    def __init__(self, connector_name: str, role: str, engine_id: str, kv_role: str) -> None:
        self.tracer = get_tracer()
        self.base: dict[str, Any] = {
            names.CONNECTOR_NAME: connector_name,
            names.CONNECTOR_ROLE: role,
            names.ENGINE_ID: engine_id,
            names.KV_ROLE: kv_role,
        }

    @contextmanager
    def hook(
        self,
        hook: str,
        parent: Context | None = None,
        links: Sequence[Link] = (),
        **attributes: Any,
    ) -> Iterator[Span]:
        """A span around one hook call; an exception is recorded and re-raised unchanged."""
        with self.tracer.start_as_current_span(
            names.SPAN_HOOK_PREFIX + hook,
            context=parent,
            links=links,
            attributes={**self.base, names.HOOK: hook, **attributes},
        ) as span:
            yield span

    def quiet_call(self, hook: str, parent: Context | None, call, *args: Any, **kwargs: Any):
        """Runs a hook that usually does nothing without a span; if it reported facts (span
        events), they get a hook span after all, timed from the call's start."""
        from kvscope.traces.events import add_events, call_buffered

        start = time.time_ns()
        result, events = call_buffered(call, *args, **kwargs)
        if events:
            span = self.start(names.SPAN_HOOK_PREFIX + hook, parent, start_time=start,
                              **{names.HOOK: hook})  # fmt: skip
            add_events(span, events)
            span.end()
        return result

    def start(
        self,
        name: str,
        parent: Context | None = None,
        links: Sequence[Link] = (),
        start_time: int | None = None,
        **attributes: Any,
    ) -> Span:
        """A span the caller ends (request and step spans)."""
        return self.tracer.start_span(
            name,
            context=parent,
            links=links,
            start_time=start_time,
            attributes={**self.base, **attributes},
        )


def child_hook_span(child_name: str, child_class: str, hook: str, **attributes: Any):
    """A hook span for one child of a composite connector, child of the current hook span."""
    return get_tracer().start_as_current_span(
        names.SPAN_HOOK_PREFIX + hook,
        attributes={
            names.CONNECTOR_CHILD: child_name,
            names.CONNECTOR_NAME: child_class,
            names.HOOK: hook,
            **attributes,
        },
    )
