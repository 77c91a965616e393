"""Scheduler-side tracing state: one open span per request, step counter, who loads what."""

from collections import OrderedDict
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Link, Span, StatusCode

from kvscope.traces import context, names
from kvscope.traces.attribute_values import request_attributes
from kvscope.traces.hook_spans import HookSpans, from_headers, to_traceparent

MAX_OPEN_REQUESTS = 65536
"""Open request spans kept; beyond it the oldest is ended as 'untracked' (a missed finish)."""


class SchedulerTracing:
    """Tracks the request spans and the per-step facts the worker metadata carries."""

    def __init__(self, spans: HookSpans) -> None:
        self.spans = spans
        self.step = 0
        self._requests: OrderedDict[str, Span] = OrderedDict()
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
            self._traceparents[req_id] = to_traceparent(span) or ""
            context.remember(req_id, self._traceparents[req_id])
            if len(self._requests) > MAX_OPEN_REQUESTS:
                self.end_request(next(iter(self._requests)), status="untracked")
        return span

    def request_context(self, request: Any):
        return trace.set_span_in_context(self.request_span(request))

    def note_load(self, req_id: str) -> None:
        self._step_loads.add(req_id)

    def note_loaded(self, req_ids: set[str]) -> None:
        self._loaded |= req_ids & self._requests.keys()

    def begin_step(self, num_scheduled_tokens: dict[str, int], new_req_ids: list[str]):
        """Advances the step; returns (traceparents of requests with KV work, loads, links)."""
        self.step += 1
        # Most steps decode one token for each request (each has at least one): told without
        # building a set.
        if not (new_req_ids or self._step_loads or self._loaded) and sum(
            num_scheduled_tokens.values()
        ) == len(num_scheduled_tokens):
            return {}, frozenset(), []
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

    def transfers_done(self, sending, recving, failed) -> None:
        """Timeline points of transfers the workers reported finished (all workers, as vLLM
        aggregates them): transfer_complete for a load, with its outcome, and send_complete."""
        for req_id in recving:
            outcome = "failed" if req_id in failed else "ok"
            self._request_event(req_id, "transfer_complete", **{names.LOAD_OUTCOME: outcome})
        for req_id in sending:
            self._request_event(req_id, "send_complete")

    def _request_event(self, req_id: str, point: str, **attributes) -> None:
        """A short span in a request's trace, for a fact that may come after its span ended."""
        span = self.spans.start(
            names.SPAN_REQUEST_EVENT,
            context.context_of(req_id),
            **{names.REQUEST_ID: req_id, names.TIMELINE_POINT: point, **attributes},
        )
        span.add_event(names.EVENT_TIMELINE, {names.TIMELINE_POINT: point})
        span.end()

    def end_request(self, req_id: str, status: str = "finished", **attributes: Any) -> None:
        span = self._requests.pop(req_id, None)
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
