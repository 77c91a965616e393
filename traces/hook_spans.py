"""Shared span plumbing for both connector halves: the tracer, base attributes, hook spans."""

import time
from collections.abc import Sequence
from typing import Any, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from kvscope.traces import names
from kvscope.traces.buffer import add_events, call_buffered

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

    def __init__(
        self, connector_name: str, role: str, engine_id: str, kv_role: str, reports: bool = True
    ) -> None:
        self.tracer = get_tracer()
        # False for a connector that never reports facts through traces.events (vLLM's own):
        # its quiet hooks then run bare, without a buffer for facts that cannot come.
        self.reports = reports
        self.base: dict[str, Any] = {
            names.CONNECTOR_NAME: connector_name,
            names.CONNECTOR_ROLE: role,
            names.ENGINE_ID: engine_id,
            names.KV_ROLE: kv_role,
        }

    def hook(
        self,
        hook: str,
        parent: Context | None = None,
        links: Sequence[Link] = (),
        /,
        **attributes: Any,
    ) -> "HookSpan":
        """A span around one hook call; an exception is recorded and re-raised unchanged.

        hook, parent and links are positional only: `**attributes` (keys from names) never
        fills them."""
        span = self.tracer.start_span(
            names.SPAN_HOOK_PREFIX + hook,
            context=parent,
            links=links,
            attributes={**self.base, names.HOOK: hook, **attributes},
        )
        return HookSpan(span)

    def quiet_call(self, hook: str, parent: Context | None, call, *args: Any, **kwargs: Any):
        """Runs a hook that usually does nothing without a span; if it reported facts (span
        events), they get a hook span after all, timed from the call's start."""
        if not self.reports:
            return call(*args, **kwargs)
        start = time.time_ns()
        result, events = call_buffered(call, *args, **kwargs)
        if events:
            span = self.start(
                names.SPAN_HOOK_PREFIX + hook, parent, start_time=start, **{names.HOOK: hook}
            )
            add_events(span, events)
            span.end()
        return result

    def start(
        self,
        name: str,
        parent: Context | None = None,
        links: Sequence[Link] = (),
        /,
        start_time: int | None = None,
        **attributes: Any,
    ) -> Span:
        """A span the caller ends (request and step spans); name, parent and links are
        positional only, as in hook()."""
        return self.tracer.start_span(
            name,
            context=parent,
            links=links,
            start_time=start_time,
            attributes={**self.base, **attributes},
        )


class HookSpan:
    """The current span while a hook runs (what `start_as_current_span` does, for the hot path:
    no generator-based context managers). Ends the span on exit; an exception is recorded,
    marks the span failed and propagates."""

    __slots__ = ("span", "_token")

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, kind, error, traceback) -> Literal[False]:
        otel_context.detach(self._token)
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, f"{kind.__name__}: {error}"))
        self.span.end()
        return False


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
