"""Scheduler-side tracing state: one open span per request, step counter, who loads what."""

from collections import OrderedDict
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, StatusCode

from kvscope.traces import context, names
from kvscope.traces.attributes import request_attributes
from kvscope.traces.spans import HookSpans, from_headers, to_traceparent

MAX_OPEN_REQUESTS = 65536
"""Open request spans kept; beyond it the oldest is ended as 'untracked' (a missed finish)."""


class SchedulerTracing:
    """Tracks the request spans and the per-step facts the worker metadata carries."""

    def __init__(self, spans: HookSpans) -> None:
        self.spans = spans
        self.step = 0
        self._requests: OrderedDict[str, Span] = OrderedDict()
        self._contexts: dict[str, Context] = {}  # each request span as a parent, made once
        self._traceparents: dict[str, str] = {}
        self._step_loads: set[str] = set()
        self._loaded: set[str] = set()

    def request_span(self, request: Any) -> Span:
        """The request's span, started at first sight, joining the client's trace if any."""
        req_id = str(request.request_id)
        span = self._requests.get(req_id)
        if span is None:
            parent = from_headers(getattr(request, "trace_headers", None))
            span = self.spans.start(names.SPAN_REQUEST, parent, **request_attributes(request))
            self._requests[req_id] = span
            self._contexts[req_id] = trace.set_span_in_context(span)
            self._traceparents[req_id] = to_traceparent(span) or ""
            context.remember(req_id, self._traceparents[req_id])
            if len(self._requests) > MAX_OPEN_REQUESTS:
                self.end_request(next(iter(self._requests)), status="untracked")
        return span

    def request_context(self, request: Any) -> Context:
        context = self._contexts.get(str(request.request_id))
        if context is None:
            self.request_span(request)
            context = self._contexts[str(request.request_id)]
        return context

    def note_load(self, req_id: str) -> None:
        self._step_loads.add(req_id)

    def note_loaded(self, req_ids: set[str]) -> None:
        self._loaded |= req_ids & self._requests.keys()

    def quiet_step(self, scheduler_output: Any) -> bool:
        """Advances the step and says True when it has no KV work for any request: one token
        each (decode), none new, preempted, loading or resumed. Checked in O(1) every step; a
        False sends the step through begin_step, which may still find it quiet."""
        if (
            self._step_loads
            or self._loaded
            or scheduler_output.scheduled_new_reqs
            or scheduler_output.preempted_req_ids
            # each scheduled request has at least one token: equal totals mean one each
            or scheduler_output.total_num_scheduled_tokens
            != len(scheduler_output.num_scheduled_tokens)
        ):
            return False
        self.step += 1
        return True

    def begin_step(self, num_scheduled_tokens: dict[str, int], new_req_ids: list[str]):
        """Advances the step; returns (traceparents of requests with KV work, loads, links)."""
        self.step += 1
        kv_work = {r for r, n in num_scheduled_tokens.items() if n > 1}
        kv_work |= set(new_req_ids) | self._step_loads
        loads = frozenset(self._step_loads)
        self._step_loads = set()
        for req_id in self._loaded & num_scheduled_tokens.keys():
            self._requests[req_id].add_event(
                names.EVENT_TIMELINE, {names.TIMELINE_POINT: "resumed"}
            )
            self._loaded.discard(req_id)
        contexts = {r: self._traceparents[r] for r in kv_work if self._traceparents.get(r)}
        links = [
            Link(self._requests[r].get_span_context(), {names.REQUEST_ID: r}) for r in contexts
        ]
        return contexts, loads, links

    def end_request(self, req_id: str, status: str = "finished", **attributes: Any) -> None:
        span = self._requests.pop(req_id, None)
        self._contexts.pop(req_id, None)
        self._traceparents.pop(req_id, None)
        self._loaded.discard(req_id)
        if span is None:
            return
        span.set_attributes({names.REQUEST_STATUS: status, **attributes})
        if status == "untracked":
            span.set_status(StatusCode.ERROR, "request finish never seen")
        span.end()

    def end_all(self) -> None:
        for req_id in list(self._requests):
            self.end_request(req_id, status="shutdown")
