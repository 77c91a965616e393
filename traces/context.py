"""This process's map from request id to the request's trace context, for spans made anywhere."""

import threading
from collections import OrderedDict

from opentelemetry.context import Context

from kvscope.traces.hook_spans import from_headers

MAX_REQUESTS = 65536
"""Requests remembered; the oldest is forgotten first (its late facts start their own trace)."""

_lock = threading.Lock()
_traceparents: OrderedDict[str, str] = OrderedDict()


def remember(req_id: str, traceparent: str) -> None:
    """Records the W3C traceparent of a request's span (scheduler) or of its metadata (worker)."""
    with _lock:
        _traceparents[req_id] = traceparent
        _traceparents.move_to_end(req_id)
        if len(_traceparents) > MAX_REQUESTS:
            _traceparents.popitem(last=False)


def context_of(req_id: str) -> Context | None:
    """The request's trace context, or None when this process never saw it."""
    traceparent = _traceparents.get(req_id)
    return from_headers({"traceparent": traceparent}) if traceparent else None
