"""What connectors call to report facts: span events on the current hook span, transfer spans.

Uses only the OpenTelemetry API: with no SDK configured every call is a cheap no-op.
"""

import time
from typing import Any

from opentelemetry import trace

from kvscope.traces import names
from kvscope.traces.buffer import keep
from kvscope.traces.context import context_of
from kvscope.traces.hook_spans import get_tracer


def add_event(name: str, **attributes: Any) -> None:
    """An event on the span of the hook being run (e.g. a lease taken during a lookup); kept
    aside when the hook runs without a span of its own, so the caller can give it one."""
    values = {k: v for k, v in attributes.items() if v is not None}
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, values)
    else:
        keep(name, values)


def monotonic_to_epoch_ns(monotonic_s: float) -> int:
    """Converts a time.monotonic() reading to the epoch nanoseconds spans use."""
    return time.time_ns() - int((time.monotonic() - monotonic_s) * 1e9)


def record_timed_span(
    name: str,
    req_id: str,
    start_monotonic_s: float,
    end_monotonic_s: float,
    error: str | None,
    attributes: dict[str, Any],
) -> None:
    """A span in the request's trace, timed by time.monotonic() readings taken when the work
    happened (often on another thread), marked failed with its cause when error is given."""
    duration_s = max(end_monotonic_s - start_monotonic_s, 0.0)
    # One conversion, the end offset from it: converting each end on its own reads the two
    # clocks twice, and their drift can put a near-instant span's end before its start (the
    # backend refuses such a span, and its stream shows a hole).
    start_ns = monotonic_to_epoch_ns(start_monotonic_s)
    span = get_tracer().start_span(
        name,
        context=context_of(req_id),
        start_time=start_ns,
        attributes={
            names.REQUEST_ID: req_id,
            names.TRANSFER_DURATION_MS: duration_s * 1000,
            names.TRANSFER_OK: error is None,
            **{k: v for k, v in attributes.items() if v is not None},
        },
    )
    if error is not None:
        span.set_status(trace.StatusCode.ERROR, error)
        span.set_attribute(names.FAILURE_CAUSE, error)
    span.end(end_time=start_ns + round(duration_s * 1e9))


def record_transfer(
    req_id: str,
    direction: str,
    num_bytes: int,
    start_monotonic_s: float,
    end_monotonic_s: float,
    error: str | None = None,
    **attributes: Any,
) -> None:
    """A kvscope.transfer span in the request's trace, timed from the copy's own clock."""
    duration_s = max(end_monotonic_s - start_monotonic_s, 0.0)
    gbps = num_bytes / duration_s / 1e9 if duration_s > 0 else 0.0
    record_timed_span(
        names.SPAN_TRANSFER,
        req_id,
        start_monotonic_s,
        end_monotonic_s,
        error,
        {
            names.TRANSFER_DIRECTION: direction,
            names.TRANSFER_BYTES: num_bytes,
            names.TRANSFER_GBPS: gbps,
            **attributes,
        },
    )
