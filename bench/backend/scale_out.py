"""Backends sharing one PostgreSQL: aggregate spans/s and per CPU-second, 1, 2 and 4 backends.

python -m kvscope.bench.backend.scale_out [--postgres URL] [--spans N] [--clients K] [--backends
1,2,4]: per backend count, a fresh database on the server (dropped after), that many backend
processes (default ingest workers, OTLP/HTTP only) and K client processes. Each client is one
engine's stream (own process id, seq from 0, random trace ids: the scale bench's bodies, encoded
before the timed part), sent a batch at a time round-robin over the backends as a plain HTTP
load balancer would; a batch holds whole requests, so a request reaches one backend (as with the
OTel Collector's loadbalancing exporter by trace id) while each engine's batches reach them all.
503s are retried as an OTel exporter retries them. Per count: spans/s, spans per backend CPU-
second (servers and ingest workers), per PostgreSQL CPU-second (its processes, when on this
machine), spans in the database against spans sent; then each count's spans/s over the first's,
in one run. Clients, backends and PostgreSQL share this machine, and the figure names its cores:
on a few, more backends cannot add CPU. Without --postgres (or KVSCOPE_BENCH_POSTGRES_URL) a
throwaway server from scripts/postgres.sh is used and stopped afterwards."""

import argparse
import multiprocessing
import os
import queue
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from unittest.mock import patch

import httpx

from kvscope.bench.backend.ingest import backend
from kvscope.bench.backend.postgres import (
    cpu_seconds,
    durability,
    fresh_database,
    postmaster,
    spans_in,
    started_server,
)
from kvscope.bench.backend.scale_spans import Batches
from kvscope.bench.common.results import record
from kvscope.traces import names

BENCH = "scale_out"
PROTOBUF = {"Content-Type": "application/x-protobuf"}
RETRIED = (429, 502, 503, 504)  # what the OTel OTLP/HTTP exporter retries
MAX_TRIES = 10
PROGRESS_EVERY_S = 5.0


@dataclass
class Outcome:
    """One backend count's run."""

    backends: int
    sent: int
    stored: int  # spans the database holds afterwards
    stored_by_backend: list[int]  # each backend's /health spans_stored_since_start
    seconds: float
    backend_cpu: float
    server_cpu: float | None  # None: PostgreSQL is not on this machine
    client_cpu: float
    retries: int
    load: float

    @property
    def rate(self) -> float:
        return self.sent / self.seconds

    def per_cpu(self, cpu: float | None) -> float:
        return self.sent / cpu if cpu else float("nan")


def client_bodies(total_spans: int, clients: int, client: int) -> tuple[list[bytes], int]:
    """This client's share of the run's batches, as one engine's stream (its own process id,
    seq numbers from 0, trace ids and requests no other client sends), and spans per batch."""
    batches = Batches(total_spans)
    share = max(1, batches.count // clients)
    first = client * share
    for resource_spans in batches.template.resource_spans:
        for attribute in resource_spans.resource.attributes:
            if attribute.key == names.PROCESS_ID:
                attribute.value.string_value = f"bench-scale-out-{client}"
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                for attribute in span.attributes:
                    if attribute.key == names.SEQ:
                        attribute.value.int_value -= first * batches.spans
    return [batches.body(batch) for batch in range(first, first + share)], batches.spans


def client_process(urls: list[str], total_spans: int, clients: int, client: int, go, ready, ends):
    """Builds its bodies (untimed), then sends each in turn to the next backend; reports
    (spans sent, retries, spans refused, CPU-seconds spent sending)."""
    bodies, spans = client_bodies(total_spans, clients, client)
    retries = failed = 0
    with httpx.Client(headers=PROTOBUF, timeout=60) as poster:
        ready.put(client)
        go.wait()
        before = time.process_time()
        for index, body in enumerate(bodies):
            tries = _post(poster, f"{urls[(client + index) % len(urls)]}/v1/traces", body)
            retries += max(0, tries - 1)
            failed += spans if tries > MAX_TRIES else 0
        cpu = time.process_time() - before
    ends.put((len(bodies) * spans, retries, failed, cpu))


def _post(poster: httpx.Client, url: str, body: bytes) -> int:
    """Tries it took (MAX_TRIES + 1: refused every time)."""
    for tries in range(1, MAX_TRIES + 1):
        status = poster.post(url, content=body).status_code
        if status == 200:
            return tries
        if status not in RETRIED:
            break
        time.sleep(min(2.0, 0.1 * 2**tries))
    return MAX_TRIES + 1


def measure(server_url: str, count: int, spans: int, clients: int, server) -> Outcome:
    """One backend count on a fresh database: start the backends, fill, count what is stored."""
    name = f"kvscope_scale_out_{uuid.uuid4().hex[:8]}_{count}"
    with fresh_database(server_url, name) as database_url, ExitStack() as running:
        # OTLP/HTTP only (backend() passes on os.environ): they cannot all take port 4317.
        running.enter_context(patch.dict(os.environ, {"KVSCOPE_BACKEND_GRPC_PORT": "0"}))
        started = time.monotonic()
        up = [running.enter_context(backend(database_url)) for _ in range(count)]
        print(f"  up in {time.monotonic() - started:.0f} s", flush=True)
        outcome = fill([url for url, _ in up], [pid for _, pid in up], server, spans, clients)
        outcome.stored = spans_in(database_url)
        return outcome


def fill(urls: list[str], pids: list[int], server, spans: int, clients: int) -> Outcome:
    """The clients send every batch; CPU is read around the sending only."""
    context = multiprocessing.get_context("spawn")
    go, ready, ends = context.Event(), context.Queue(), context.Queue()
    processes = [
        context.Process(target=client_process, args=(urls, spans, clients, k, go, ready, ends))
        for k in range(clients)
    ]
    with ExitStack() as running:
        for process in processes:
            process.start()
            running.callback(process.kill)  # a no-op once it has exited
        _collect(ready, processes)  # bodies built; the backends and the server are idle
        backend_cpu, server_cpu = cpu_seconds(pids, server)
        go.set()
        started = time.perf_counter()
        finished = _collect(ends, processes, lambda: _progress(urls, started))
        seconds = time.perf_counter() - started
        backend_after, server_after = cpu_seconds(pids, server)
        for process in processes:
            process.join(timeout=30)
    sent, retries, failed, client_cpu = (sum(column) for column in zip(*finished, strict=True))
    if failed:
        raise SystemExit(f"{failed} spans refused {MAX_TRIES} times (see the backends' output)")
    return Outcome(
        backends=len(urls),
        sent=sent,
        stored=0,
        stored_by_backend=_health(urls),
        seconds=seconds,
        backend_cpu=backend_after - backend_cpu,
        server_cpu=server_after - server_cpu if server else None,
        client_cpu=client_cpu,
        retries=retries,
        load=os.getloadavg()[0],
    )


def _collect(messages, processes: list, waiting=None) -> list:
    """One message from each client process; a client that died ends the bench."""
    found = []
    while len(found) < len(processes):
        try:
            found.append(messages.get(timeout=PROGRESS_EVERY_S))
        except queue.Empty:
            if any(process.exitcode not in (None, 0) for process in processes):
                raise SystemExit("a client process failed (see its output above)") from None
            if waiting is not None:
                waiting()
    return found


def _progress(urls: list[str], started: float) -> None:
    stored = sum(_health(urls))
    print(f"  {stored:>10,} spans stored, {stored / (time.perf_counter() - started):,.0f}/s")


def _health(urls: list[str]) -> list[int]:
    """What each backend says it stored (its /health)."""
    return [httpx.get(f"{u}/health", timeout=10).json()["spans_stored_since_start"] for u in urls]


def shared_machine(cores: int, server) -> str:
    if server is None:
        return f"clients and backends on one machine of {cores} cores (PostgreSQL not found on it)"
    return f"clients, backends and PostgreSQL on one machine of {cores} cores"


def report(outcomes: list[Outcome], clients: int, cores: int, where: str) -> None:
    """Prints the table and each count's spans/s over the first's, and records them."""
    print(
        f"\n{where}. More backends cannot add CPU to this machine: the ratios show what "
        "sharing one database costs or gains here, not what a fleet of machines would reach.\n"
    )
    print("backends  spans/s  per backend CPU-s  per PostgreSQL CPU-s  cores busy  stored/sent")
    for o in outcomes:
        busy = (o.backend_cpu + (o.server_cpu or 0) + o.client_cpu) / (o.seconds * cores)
        print(
            f"{o.backends:>8} {o.rate:>8,.0f} {o.per_cpu(o.backend_cpu):>18,.0f} "
            f"{o.per_cpu(o.server_cpu):>21,.0f} {busy:>11.2f}  {o.stored:,}/{o.sent:,} "
            f"({o.retries} retried, load {o.load:.1f})"
        )
        label = f"{o.backends}_backend{'s' if o.backends != 1 else ''}"
        figures = [
            (f"spans_per_s_{label}", o.rate, "spans/s", ""),
            (f"spans_per_backend_cpu_s_{label}", o.per_cpu(o.backend_cpu), "spans/CPU-s", ""),
            (f"spans_missing_{label}", o.sent - o.stored, "spans", "== 0"),
        ]
        if o.server_cpu is not None:
            per_server = o.per_cpu(o.server_cpu)
            figures.append((f"spans_per_postgres_cpu_s_{label}", per_server, "spans/CPU-s", ""))
        note = f"{o.sent:,} spans, {clients} clients; {where}; load {o.load:.1f}"
        for metric, value, unit, target in figures:
            record(BENCH, metric, value, unit, target, note)
    first = outcomes[0]
    for o in outcomes[1:]:
        ratio = o.rate / first.rate
        print(f"aggregate spans/s, {o.backends} backends over {first.backends}: {ratio:.2f}x")
        metric = f"spans_per_s_{o.backends}_backends_over_{first.backends}"
        record(BENCH, metric, ratio, "ratio", "", f"one run, one count after another; {where}")


def run(server_url: str, spans: int, clients: int, counts: list[int]) -> list[Outcome]:
    """Measures each backend count in turn and prints the figure; returns the outcomes."""
    server, cores = postmaster(server_url), os.cpu_count() or 1
    where = f"{shared_machine(cores, server)}; PostgreSQL with {durability(server_url)}"
    print(f"{spans:,} spans from {clients} clients per backend count; {where}")
    outcomes = []
    for count in counts:
        print(f"\n{count} backend(s) sharing one fresh database ...", flush=True)
        outcomes.append(measure(server_url, count, spans, clients, server))
        print(f"  {outcomes[-1].rate:,.0f} spans/s, {outcomes[-1].stored:,} stored", flush=True)
    report(outcomes, clients, cores, where)
    missing = [o.backends for o in outcomes if o.stored != o.sent]
    if missing:
        raise SystemExit(f"spans sent but not stored with {missing} backend(s): see the table")
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get("KVSCOPE_BENCH_POSTGRES_URL"),
        help="a PostgreSQL server (a database per backend count is made there, then dropped)",
    )
    parser.add_argument("--spans", type=int, default=200_000, help="spans per backend count")
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--backends", default="1,2,4", help="backend counts (ratios to the first)")
    arguments = parser.parse_args(argv)
    counts = [int(count) for count in arguments.backends.split(",")]
    with ExitStack() as stack:
        server_url = arguments.postgres or stack.enter_context(started_server())
        run(server_url, arguments.spans, arguments.clients, counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
