"""Facts a hook reports while no span is recording, kept for the span that ends up covering them."""

import time
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

Event = tuple[str, dict, int]
"""An event as (name, attributes, epoch ns)."""

Kept = list[Event]
"""The events a caller keeps (call_buffered, keep_for_step)."""

Events = Sequence[Event]
"""Events to put on a span: those kept, or none (an empty tuple)."""

_buffer: ContextVar[Kept | None] = ContextVar("kvscope_event_buffer", default=None)


def keep(name: str, attributes: dict[str, Any]) -> None:
    """Keeps an event for the caller's span, when a caller is collecting (else drops it)."""
    if (buffer := _buffer.get()) is not None:
        buffer.append((name, attributes, time.time_ns()))


def collecting() -> bool:
    """Whether a caller keeps what hooks report while no span records (see keep)."""
    return _buffer.get() is not None


def call_buffered(call, *args: Any, **kwargs: Any) -> tuple[Any, Kept]:
    """Runs call and returns (its result, the events it kept while no span was recording)."""
    events: Kept = []
    token = _buffer.set(events)
    try:
        return call(*args, **kwargs), events
    finally:
        _buffer.reset(token)


def keep_for_step() -> Kept:
    """Keeps what hooks report from here until end_step_keeping() (a quiet step: vLLM calls the
    wrapped connector's hooks directly, none of them in a span or in call_buffered)."""
    events: Kept = []
    _buffer.set(events)
    return events


def end_step_keeping() -> None:
    """Stops keeping what hooks report (the quiet step ended)."""
    _buffer.set(None)


def add_events(span: trace.Span, events: Events) -> None:
    """Puts events kept by call_buffered() on the span that ended up covering them."""
    for name, attributes, timestamp in events:
        span.add_event(name, attributes, timestamp=timestamp)
