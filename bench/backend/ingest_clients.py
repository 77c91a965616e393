"""The ingest bench's clients: realistic kvscope spans, exported by processes in timed rounds.

Two kinds of client process: "otel" exports with the OpenTelemetry SDK's OTLP/HTTP exporter
(encoding included, as an engine would), "replay" posts bodies that exporter encoded
beforehand (almost free: the backend alone is measured).
"""

import itertools
import multiprocessing
import random
import time

import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.traces import names

BATCH = 512  # the OTel BatchSpanProcessor's default max_export_batch_size
CHUNK_SPANS = 20_000  # spans generated (untimed) before each timed export round
MS = 1_000_000
CLIENTS = ("otel", "replay")


class Collector(SpanProcessor):
    """Numbers spans like traces.sdk does and keeps the ended ones in a list."""

    def __init__(self) -> None:
        self.spans: list = []
        self.seq = itertools.count()

    def on_start(self, span, parent_context=None) -> None:
        span.set_attribute(names.SEQ, next(self.seq))

    def on_end(self, span) -> None:
        self.spans.append(span)


def make_tracer(origin: str):
    collector = Collector()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "bench-engine", names.PROCESS_ID: origin})
    )
    provider.add_span_processor(collector)
    return provider.get_tracer(names.INSTRUMENTATION_NAME), collector


def vllm_request_id(rng: random.Random) -> str:
    """A request id as a served vLLM hands its connectors: the OpenAI server's 'cmpl-' and a
    random UUID's hex, the prompt's index, and the 8 random characters the engine appends
    (vllm/v1/engine/input_processor.py). Random, so every index led by request ids takes
    random inserts, as in production; ids that grow with the index would not."""
    return f"cmpl-{rng.getrandbits(128):032x}-0-{rng.getrandbits(32):08x}"


def request_spans(tracer, index: int, t0: int) -> None:
    """About ten spans in the shapes the connectors emit for one request with a load."""
    base = {
        names.ENGINE_ID: "bench",
        names.CONNECTOR_NAME: "CPUOffloadConnector",
        names.REQUEST_ID: vllm_request_id(random.Random(index)),
    }
    request = tracer.start_span(names.SPAN_REQUEST, start_time=t0, attributes=base)
    parent = trace.set_span_in_context(request)
    for offset, hook, extra in (
        (1, "get_num_new_matched_tokens", {names.TOKENS_EXTERNAL_HIT: 64}),
        (3, "update_state_after_alloc", {names.TOKENS_TO_LOAD: 64, names.BLOCK_IDS: [1, 2, 3, 4]}),
    ):
        span = tracer.start_span(
            names.SPAN_HOOK_PREFIX + hook,
            parent,
            start_time=t0 + offset * MS,
            attributes={**base, **extra},
        )
        span.end(end_time=t0 + (offset + 1) * MS)
    work = tracer.start_span(
        names.SPAN_WORKER_REQUEST, parent, start_time=t0 + 5 * MS, attributes=base
    )
    for offset, point in ((6, "transfer_submitted"), (8, "forward_start"), (9, "layer_ready")):
        work.add_event(
            names.EVENT_TIMELINE, {names.TIMELINE_POINT: point}, timestamp=t0 + offset * MS
        )
    work.add_event(
        names.EVENT_BLOCK_LOADED, {names.BLOCK_IDS: [1, 2, 3, 4]}, timestamp=t0 + 10 * MS
    )
    transfer = tracer.start_span(
        names.SPAN_TRANSFER,
        trace.set_span_in_context(work),
        start_time=t0 + 6 * MS,
        attributes={
            **base,
            names.TRANSFER_BYTES: 1 << 20,
            names.TRANSFER_DIRECTION: "load",
            names.TRANSFER_PEER: "host",
        },
    )
    transfer.end(end_time=t0 + 9 * MS)
    work.end(end_time=t0 + 11 * MS)
    for offset in (12, 13, 14, 15):
        step = tracer.start_span(
            names.SPAN_STEP,
            start_time=t0 + offset * MS,
            attributes={names.STEP: index * 4 + offset},
        )
        step.end(end_time=t0 + offset * MS + 500_000)
    finished = tracer.start_span(
        names.SPAN_HOOK_PREFIX + "request_finished",
        parent,
        start_time=t0 + 20 * MS,
        attributes=base,
    )
    finished.end(end_time=t0 + 21 * MS)
    request.end(end_time=t0 + 21 * MS)


def client_process(
    kind: str, url: str, rounds: list[int], first_index: int, barrier, counts, ends
) -> None:
    """One exporting process (an engine, say): per round it generates its share of spans
    (untimed), waits at the barrier, sends them in BATCH-sized requests, waits again."""
    tracer, collector = make_tracer(f"bench-{random.getrandbits(48):x}")
    exporter = OTLPSpanExporter(endpoint=f"{url}/v1/traces", timeout=30)
    poster = httpx.Client(headers={"Content-Type": "application/x-protobuf"}, timeout=30)
    t0 = time.time_ns() - 3600 * 10**9
    index, failed, cpu = first_index, 0, 0.0
    for count in rounds:
        collector.spans = []
        while len(collector.spans) < count:
            request_spans(tracer, index, t0 + index * 25 * MS)
            index += 1
        batches = [collector.spans[at : at + BATCH] for at in range(0, count, BATCH)]
        if kind == "replay":
            batches = [(len(b), encode_spans(b).SerializeToString()) for b in batches]
        barrier.wait()
        before = time.process_time()
        for batch in batches:
            if kind == "replay":
                ok = poster.post(f"{url}/v1/traces", content=batch[1]).status_code == 200
                failed += 0 if ok else batch[0]
            elif exporter.export(batch) != SpanExportResult.SUCCESS:
                failed += len(batch)
        cpu += time.process_time() - before
        counts.put(count)
        barrier.wait()
    exporter.shutdown()
    poster.close()
    ends.put((failed, cpu))


def fill(
    kind: str, url: str, total_spans: int, clients: int
) -> tuple[int, float, list[float], float]:
    """Has `clients` processes send about total_spans spans, CHUNK_SPANS per timed round.

    Returns the count, the seconds spent exporting, each round's rate (spans/s), whose
    spread shows how much the neighbours on a shared machine moved the figure, and the
    CPU-seconds the clients spent exporting.
    """
    context = multiprocessing.get_context("spawn")
    # Two queues: one process's messages may overtake another's on a shared queue.
    barrier, counts, ends = context.Barrier(clients + 1), context.Queue(), context.Queue()
    share = [
        min(CHUNK_SPANS, total_spans - sent) // clients
        for sent in range(0, total_spans, CHUNK_SPANS)
    ]
    processes = [
        context.Process(
            target=client_process, args=(kind, url, share, n * 10**7, barrier, counts, ends)
        )
        for n in range(clients)
    ]
    for process in processes:
        process.start()
    sent, seconds, rates = 0, 0.0, []
    try:
        for _ in share:
            barrier.wait(timeout=600)  # every client has its spans ready
            started = time.perf_counter()
            barrier.wait(timeout=600)  # every client has exported them
            round_s = time.perf_counter() - started
            stored = sum(counts.get(timeout=10) for _ in processes)
            rates.append(stored / round_s)
            seconds += round_s
            sent += stored
            print(
                f"  {sent:>9} spans stored, {sent / seconds:,.0f} spans/s so far "
                f"(this round {rates[-1]:,.0f}/s)",
                flush=True,
            )
        finished = [ends.get(timeout=60) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    failed = sum(failed for failed, _ in finished)
    if failed:
        raise SystemExit(f"{failed} spans failed to export")
    return sent, seconds, rates, sum(cpu for _, cpu in finished)
