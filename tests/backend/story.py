"""Builds realistic kvscope spans with the real OpenTelemetry SDK, following traces.names."""

import itertools
import uuid
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvscope.traces import names

MS = 1_000_000


class SeqNumbers(SpanProcessor):
    """Numbers spans in start order per process, as the contract in traces.names asks."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.next = itertools.count()

    def on_start(self, span, parent_context=None) -> None:
        span.set_attributes({names.SEQ: next(self.next), names.SEQ_ORIGIN: self.origin})


@dataclass
class Process:
    """One traced process: its provider, tracer and the spans it ended."""

    service: str
    engine_id: str
    role: str
    origin: str = field(default_factory=lambda: f"proc-{uuid.uuid4().hex[:12]}")

    def __post_init__(self) -> None:
        resource = Resource.create(
            {"service.name": self.service, names.PROCESS_ID: self.origin, names.SCHEMA: 1}
        )
        self.provider = TracerProvider(resource=resource)
        self.memory = InMemorySpanExporter()
        self.provider.add_span_processor(SeqNumbers(self.origin))
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer(names.INSTRUMENTATION_NAME)

    def start(self, name: str, at_ns: int, parent=None, links=(), **attributes):
        base = {
            names.CONNECTOR_NAME: "CPUOffloadConnector",
            names.CONNECTOR_ROLE: self.role,
            names.ENGINE_ID: self.engine_id,
            names.KV_ROLE: "kv_both",
        }
        context = trace.set_span_in_context(parent) if parent is not None else None
        return self.tracer.start_span(
            name,
            context=context,
            links=list(links),
            start_time=at_ns,
            attributes={**base, **attributes},
        )

    def hook(self, hook: str, parent, start_ns: int, end_ns: int, events=(), **attributes):
        span = self.start(
            names.SPAN_HOOK_PREFIX + hook, start_ns, parent, **{names.HOOK: hook, **attributes}
        )
        for event_name, at_ns, event_attributes in events:
            span.add_event(event_name, event_attributes, timestamp=at_ns)
        span.end(end_time=end_ns)
        return span

    def spans(self):
        return list(self.memory.get_finished_spans())


def load_story(
    scheduler: Process,
    worker: Process,
    api: Process | None,
    req_id: str,
    t0: int,
    lease_id: int = 7,
    host_ids=(3, 4),
    parent=None,
) -> None:
    """A request whose prefix is loaded from the host pool: every timeline point occurs.
    `parent`: a client's span whose trace the request joins (a reused trace)."""
    host_ids = list(host_ids)
    request = scheduler.start(
        names.SPAN_REQUEST, t0, parent, **{names.REQUEST_ID: req_id, names.PROMPT_TOKENS: 96}
    )
    scheduler.hook(
        "update_connector_output",
        None,
        t0 + MS // 2,
        t0 + MS,
        events=[
            (
                names.EVENT_BLOCK_STORED,
                t0 + MS // 2 + 1,
                {
                    names.BLOCK_TIER: "host",
                    names.HOST_BLOCK_IDS: host_ids + [host_ids[-1] + 1],
                    names.BLOCK_HASHES: ["aa01", "aa02", "aa03"],
                },
            )
        ],
    )
    scheduler.hook(
        "get_num_new_matched_tokens",
        request,
        t0 + 1 * MS,
        t0 + 2 * MS,
        events=[
            (
                names.EVENT_LEASE_ACQUIRED,
                t0 + 2 * MS - 1,
                {
                    names.LEASE_ID: lease_id,
                    names.LEASE_HOLDER: req_id,
                    names.HOST_BLOCK_IDS: host_ids,
                    names.LEASE_TIMEOUT_S: 30.0,
                },
            )
        ],
        **{
            names.REQUEST_ID: req_id,
            names.TOKENS_LOCAL_HIT: 0,
            names.TOKENS_EXTERNAL_HIT: 64,
            names.LOAD_ASYNC: True,
        },
    )
    scheduler.hook(
        "update_state_after_alloc",
        request,
        t0 + 3 * MS,
        t0 + 4 * MS,
        **{names.REQUEST_ID: req_id, names.TOKENS_TO_LOAD: 64, names.BLOCK_IDS: [10, 11]},
    )
    _worker_step(worker, request, req_id, t0)
    scheduler.hook(
        "update_connector_output",
        None,
        t0 + 19 * MS,
        t0 + 19 * MS + 10,
        events=[(names.EVENT_LEASE_RELEASED, t0 + 19 * MS + 5, {names.LEASE_ID: lease_id})],
        **{names.FINISHED_RECVING: [req_id]},
    )
    request.add_event(
        names.EVENT_TIMELINE, {names.TIMELINE_POINT: "resumed"}, timestamp=t0 + 20 * MS
    )
    scheduler.hook(
        "update_connector_output",
        None,
        t0 + 25 * MS,
        t0 + 25 * MS + 10,
        events=[
            (
                names.EVENT_BLOCK_EVICTED,
                t0 + 25 * MS + 5,
                {names.BLOCK_TIER: "host", names.HOST_BLOCK_IDS: [host_ids[-1] + 1]},
            )
        ],
    )
    scheduler.hook(
        "request_finished",
        request,
        t0 + 30 * MS,
        t0 + 31 * MS,
        **{names.REQUEST_ID: req_id, names.BLOCK_IDS: [10, 11]},
    )
    request.set_attribute("kvscope.request.status", "FINISHED_STOPPED")
    request.end(end_time=t0 + 31 * MS)
    if api is not None:
        llm = api.start(
            "llm_request",
            t0 - MS,
            **{
                names.REQUEST_ID: req_id.rsplit("-", 1)[0],
                "gen_ai.latency.time_to_first_token": 0.040,
                "gen_ai.latency.time_in_queue": 0.0005,
            },
        )
        llm.end(end_time=t0 + 32 * MS)


def _worker_step(worker: Process, request, req_id: str, t0: int) -> None:
    work = worker.start(
        names.SPAN_WORKER_REQUEST, t0 + 5 * MS, request, **{names.REQUEST_ID: req_id, names.STEP: 1}
    )
    link = trace.Link(work.get_span_context(), {names.REQUEST_ID: req_id})
    step = worker.start(names.SPAN_STEP, t0 + 5 * MS, None, [link], **{names.STEP: 1})
    worker.hook("start_load_kv", step, t0 + 6 * MS, t0 + 7 * MS, **{names.STEP: 1})
    work.add_event(
        names.EVENT_TIMELINE, {names.TIMELINE_POINT: "transfer_submitted"}, timestamp=t0 + 6 * MS
    )
    transfer = worker.start(
        names.SPAN_TRANSFER,
        t0 + 6 * MS,
        work,
        **{
            names.REQUEST_ID: req_id,
            names.TRANSFER_DIRECTION: "load",
            names.TRANSFER_PEER: "host",
            names.TRANSFER_BYTES: 1 << 20,
            names.TRANSFER_DURATION_MS: 5.0,
            names.BLOCK_COUNT: 2,
        },
    )
    transfer.end(end_time=t0 + 11 * MS)
    work.add_event(
        names.EVENT_TIMELINE, {names.TIMELINE_POINT: "forward_start"}, timestamp=t0 + 8 * MS
    )
    for layer in range(2):
        work.add_event(
            names.EVENT_TIMELINE,
            {names.TIMELINE_POINT: "layer_ready", names.LAYER_INDEX: layer},
            timestamp=t0 + (9 + layer) * MS,
        )
    work.add_event(
        names.EVENT_BLOCK_LOADED,
        {names.BLOCK_TIER: "device", names.BLOCK_IDS: [10, 11]},
        timestamp=t0 + 11 * MS,
    )
    work.end(end_time=t0 + 12 * MS)
    step.end(end_time=t0 + 12 * MS)
    done = worker.start(
        names.SPAN_REQUEST_EVENT,
        t0 + 15 * MS,
        request,
        **{names.REQUEST_ID: req_id, names.TIMELINE_POINT: "transfer_complete"},
    )
    done.add_event(
        names.EVENT_TIMELINE, {names.TIMELINE_POINT: "transfer_complete"}, timestamp=t0 + 15 * MS
    )
    done.end(end_time=t0 + 15 * MS)


def failure_story(
    scheduler: Process, worker: Process, req_id: str, t0: int, lease_id: int = 9, parent=None
) -> None:
    """A load that fails: expired lease, failed transfer, recompute policy."""
    request = scheduler.start(names.SPAN_REQUEST, t0, parent, **{names.REQUEST_ID: req_id})
    scheduler.hook(
        "get_num_new_matched_tokens",
        request,
        t0 + MS,
        t0 + 2 * MS,
        events=[
            (
                names.EVENT_LEASE_ACQUIRED,
                t0 + 2 * MS - 1,
                {
                    names.LEASE_ID: lease_id,
                    names.LEASE_HOLDER: req_id,
                    names.HOST_BLOCK_IDS: [20],
                    names.LEASE_TIMEOUT_S: 0.001,
                },
            )
        ],
        **{names.REQUEST_ID: req_id, names.TOKENS_EXTERNAL_HIT: 32},
    )
    work = worker.start(
        names.SPAN_WORKER_REQUEST, t0 + 3 * MS, request, **{names.REQUEST_ID: req_id}
    )
    transfer = worker.start(
        names.SPAN_TRANSFER,
        t0 + 3 * MS,
        work,
        **{
            names.REQUEST_ID: req_id,
            names.TRANSFER_DIRECTION: "p2p_read",
            names.TRANSFER_PEER: "engine-prefill",
            names.TRANSFER_OK: False,
            names.FAILURE_CAUSE: "peer_dead",
        },
    )
    transfer.end(end_time=t0 + 4 * MS)
    work.add_event(
        names.EVENT_LOAD_FAILED,
        {
            names.FAILURE_CAUSE: "load_error",
            names.FAILURE_POLICY: "recompute",
            names.FAILURE_OUTCOME: "recomputed",
            names.LOAD_ERROR_BLOCK_IDS: [12],
        },
        timestamp=t0 + 4 * MS,
    )
    work.end(end_time=t0 + 5 * MS)
    scheduler.hook(
        "update_connector_output",
        None,
        t0 + 6 * MS,
        t0 + 7 * MS,
        events=[(names.EVENT_LEASE_EXPIRED, t0 + 6 * MS + 1, {names.LEASE_ID: lease_id})],
    )
    request.set_attribute("kvscope.request.status", "FINISHED_STOPPED")
    request.end(end_time=t0 + 8 * MS)
