"""Backend ingest rate (spans/s via the OTel OTLP/HTTP exporter) and timeline query p95.

python -m kvscope.bench.backend.ingest [--spans N] [--postgres URL] [--clients 4]: starts the
backend (its default settings) in a subprocess per database, exports realistic kvscope spans in
512-span batches from client processes, then times GET /api/v1/requests/{id}/timeline with N
spans stored. The clients stand for the processes of a deployment that export spans: each
engine, and vLLM's API servers when their own tracing is on. Four by default: an OTel exporter
sends one batch at a time and waits for the answer, so two of them left the cores idle a fifth
of the time (0.80-0.83 of what their CPU use allowed, against 0.90-0.92 with four).
Then, on fresh databases, the backend with 2 ingest worker processes against the backend
decoding in its server process, with the OTel exporter as the client and with a replaying
client that costs almost nothing (the backend's own capacity), side by side.
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import httpx

from kvscope.bench.backend.ingest_clients import CHUNK_SPANS, fill
from kvscope.bench.common.results import record
from kvscope.bench.pd.pd_pair import pid_cpu_seconds
from kvscope.harness.engine import free_port

BENCH = "ingest"
TARGET_SPANS_PER_S = 20_000
TARGET_P95_MS = 50.0


@contextmanager
def backend(database_url: str, workers: int | None = None, group_commit: bool = True):
    """The backend as a separate process, as in production: its own interpreter and GIL.
    `workers`: its ingest worker processes (None: its default, one per core up to 4)."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "KVSCOPE_BACKEND_LOG_LEVEL": "warning",
        "KVSCOPE_BACKEND_RETENTION_MAX_SPANS": str(10**9),
        "KVSCOPE_BACKEND_GROUP_COMMIT": str(group_commit).lower(),
    }
    env.pop("KVSCOPE_BACKEND_INGEST_WORKERS", None)
    if workers is not None:
        env["KVSCOPE_BACKEND_INGEST_WORKERS"] = str(workers)
    process = subprocess.Popen(
        [sys.executable, "-m", "kvscope.backend", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not _ready(url):  # its ingest workers too: their imports are not timed
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"backend for {database_url} did not start (see its output)")
            time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def _ready(url: str) -> bool:
    try:
        health = httpx.get(f"{url}/health", timeout=1)
    except httpx.HTTPError:
        return False
    return health.status_code == 200 and health.json()["ingest_workers"]["ready"]


def timeline_p95(url: str, samples: int) -> tuple[float, float]:
    with httpx.Client(base_url=url, timeout=30) as client:
        total = client.get("/api/v1/requests", params={"limit": 1}).json()["total"]
        # Ids have holes on PostgreSQL (upserts use sequence values): pick stored requests.
        ids = [
            client.get(
                "/api/v1/requests", params={"limit": 1, "offset": random.randrange(total)}
            ).json()["items"][0]["id"]
            for _ in range(samples)
        ]
        latencies = []
        for request_key in ids:
            started = time.perf_counter()
            response = client.get(f"/api/v1/requests/{request_key}/timeline")
            latencies.append((time.perf_counter() - started) * 1e3)
            response.raise_for_status()
    latencies.sort()
    return statistics.median(latencies), latencies[int(0.95 * (len(latencies) - 1))]


def run_one(
    label: str,
    database_url: str,
    spans: int,
    clients: int,
    samples: int,
    workers: int | None,
    kind: str = "otel",
    group_commit: bool = True,
) -> tuple[list[float], float]:
    """Stores `spans` spans and prints the figures; returns each round's rate and the spans
    per backend CPU-second."""
    setting = "its default ingest workers" if workers is None else f"{workers} ingest workers"
    print(
        f"{label}: storing {spans:,} spans from {clients} {kind} client processes, backend "
        f"with {setting}",
        flush=True,
    )
    with backend(database_url, workers, group_commit) as (url, pid):
        cpu_before = pid_cpu_seconds(pid)  # the server and its ingest workers
        sent, seconds, rates, client_cpu = fill(kind, url, spans, clients)
        backend_cpu = pid_cpu_seconds(pid) - cpu_before
        p50, p95 = timeline_p95(url, samples) if samples else (float("nan"),) * 2
    rate = sent / seconds
    print(
        f"{label}: ingest {rate:,.0f} spans/s wall = {rate / TARGET_SPANS_PER_S:.2f}x the "
        f"{TARGET_SPANS_PER_S:,}/s target (clients, backend and neighbours share the cores; "
        f"rounds {min(rates):,.0f}..{max(rates):,.0f}/s, load average {os.getloadavg()[0]:.1f})"
    )
    # Spans per backend CPU-second: what one free core would sustain, whatever the load.
    capacity = sent / backend_cpu if backend_cpu else float("inf")
    print(
        f"{label}: backend used {backend_cpu:.1f} CPU-s = {capacity:,.0f} spans per "
        f"CPU-second = {capacity / TARGET_SPANS_PER_S:.2f}x the target on one core"
    )
    # Clients and backend share the cores: with two cores to themselves, the wall rate could
    # reach at most 2 / (1/backend rate + 1/client rate), each per CPU-second.
    client_rate = sent / client_cpu if client_cpu else float("inf")
    ceiling = 2 / (1 / capacity + 1 / client_rate)
    print(
        f"{label}: the {kind} clients used {client_cpu:.1f} CPU-s = {client_rate:,.0f} "
        f"spans per CPU-second; two free cores would cap the wall rate at {ceiling:,.0f}/s, "
        f"and this run reached {rate / ceiling:.2f}x that"
    )
    note = f"{sent} spans, {clients} {kind} clients, load average {os.getloadavg()[0]:.1f}"
    target = f">= {TARGET_SPANS_PER_S}"
    record(BENCH, f"{label}_spans_per_s", rate, "spans/s", target, note)
    record(BENCH, f"{label}_spans_per_backend_cpu_s", capacity, "spans/CPU-s", "", note)
    if kind == "otel":
        # OTel clients do the same work per span in every run (the SDK encoding the same
        # spans): over it, the backend's cost no longer moves with the shared machine's speed.
        # Replay clients only post bytes: a ratio to them says nothing of the kind.
        over_clients = backend_cpu / client_cpu if client_cpu else float("nan")
        print(
            f"{label}: backend CPU per span over the otel clients' = {over_clients:.3f} (the "
            "machine's speed cancels out)"
        )
        record(BENCH, f"{label}_backend_cpu_over_client_cpu", over_clients, "ratio", "", note)
    record(BENCH, f"{label}_wall_vs_two_core_ceiling", rate / ceiling, "ratio", "", note)
    if samples:
        print(
            f"{label}: timeline query with {sent:,} spans stored: p50 {p50:.1f} ms, p95 "
            f"{p95:.1f} ms = {p95 / TARGET_P95_MS:.2f}x the {TARGET_P95_MS:.0f} ms budget"
        )
        record(BENCH, f"{label}_timeline_p95_ms", p95, "ms", f"<= {TARGET_P95_MS:.0f} ms", note)
    return rates, capacity


def compare(database: str, url_of, arguments) -> None:
    """The backend as deployed by default, with the full span count and query timings; then
    2 ingest workers against none, with each kind of client, on fresh databases."""
    run_one(
        database, url_of("default"), arguments.spans, arguments.clients, arguments.samples, None
    )
    spans = max(CHUNK_SPANS, arguments.compare_spans)
    if database == "sqlite":
        group_commit(database, url_of, arguments, spans)
    for kind in ("otel", "replay"):
        rates = {}
        for workers, name in ((2, "workers"), (0, "in_process")):
            label = f"{database}_{kind}_{name}"
            rates[name], _ = run_one(
                label, url_of(label), spans, arguments.clients, 0, workers, kind
            )
        ratio = statistics.median(rates["workers"]) / statistics.median(rates["in_process"])
        print(
            f"{database}, {kind} clients: 2 ingest workers over decoding in the server "
            f"process: {ratio:.2f}x (median rounds of {spans:,} spans each)"
        )
        record(
            BENCH,
            f"{database}_{kind}_workers_over_in_process",
            ratio,
            "ratio",
            "",
            f"{spans} spans each, {kind} clients",
        )


def group_commit(database: str, url_of, arguments, spans: int) -> None:
    """The default backend with group commit against one commit per batch, side by side
    (alternating, twice each), in spans per backend CPU-second."""
    capacity: dict[bool, list[float]] = {True: [], False: []}
    for grouped in (False, True, False, True):
        label = f"{database}_{'group_commit' if grouped else 'commit_per_batch'}"
        _, found = run_one(
            label,
            url_of(f"{label}_{len(capacity[grouped])}"),
            spans,
            arguments.clients,
            0,
            None,
            "otel",
            grouped,
        )
        capacity[grouped].append(found)
    ratio = statistics.median(capacity[True]) / statistics.median(capacity[False])
    print(
        f"{database}: group commit over a commit per batch: {ratio:.2f}x spans per backend "
        f"CPU-second (load average {os.getloadavg()[0]:.1f})"
    )
    record(
        BENCH,
        f"{database}_group_commit_over_commit_per_batch",
        ratio,
        "ratio",
        "",
        f"{spans} spans each, twice each, alternating",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--spans",
        type=int,
        default=60_000,
        help="spans to store before timing queries (1000000 for the full figure)",
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get("KVSCOPE_BENCH_POSTGRES_URL"),
        help="also measure PostgreSQL at this URL (tables are created there)",
    )
    parser.add_argument("--clients", type=int, default=4, help="exporter processes")
    parser.add_argument("--samples", type=int, default=200, help="timeline queries timed")
    parser.add_argument(
        "--compare-spans", type=int, default=60_000, help="spans each compared backend stores"
    )
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        compare("sqlite", lambda name: f"sqlite:///{folder}/{name}.db", arguments)
    if arguments.postgres:
        compare("postgres", lambda _: arguments.postgres, arguments)


if __name__ == "__main__":
    main()
