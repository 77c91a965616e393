"""Backend at scale: ingest rate with N spans stored against an empty database, timeline,
summary and series p95 at N, and database bytes per span (SQLite, then PostgreSQL with
--postgres or --with-postgres).

python -m kvscope.bench.backend.scale [--spans 10000000] [--postgres SERVER_URL]: replays OTLP
protobuf bodies (520 spans each, the shapes the connectors emit, every batch its own traces and
requests) into the backend's app in this process (decode, derive, write; HTTP routing through
Starlette's test client, no sockets), retention off. The rate over the first tenth of the fill
(an empty database growing; at least CHUNK spans) and over the last tenth (0.9 N to N stored)
are measured in the same run; their ratio is the verdict (one stretch at each end varied by 15%
from stretch to stretch here). Then the reads the dashboard makes are timed with N spans stored."""

import argparse
import math
import os
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from fastapi.testclient import TestClient
from sqlmodel import Session

from kvscope.backend.db.database import make_engine
from kvscope.backend.main import create_app
from kvscope.backend.metrics import database_bytes as stored_bytes
from kvscope.backend.settings import Settings
from kvscope.bench.backend.postgres import (
    cpu_seconds,
    durability,
    fresh_database,
    postmaster,
    started_server,
)
from kvscope.bench.backend.scale_reads import count_ways, reads
from kvscope.bench.backend.scale_spans import Batches
from kvscope.bench.common.profiles import PySpy, compare
from kvscope.bench.common.results import record

BENCH = "scale"
CHUNK = 100_000
"""Spans per measured stretch."""
ENDS = 0.1
"""The share of the fill whose stretches give each end's rate (at least one stretch)."""
TARGET_P95_MS = 50.0
TARGET_INGEST_RATIO = 0.9
PROTOBUF = {"Content-Type": "application/x-protobuf"}
TOKEN = "scale-bench"  # the test client is not on loopback: a tokenless backend refuses it


def size_label(spans: int) -> str:
    """10_000_000 -> '10m', 2_000_000 -> '2m', 300_000 -> '300k'."""
    if spans >= 1_000_000 and spans % 1_000_000 == 0:
        return f"{spans // 1_000_000}m"
    if spans >= 1_000_000:
        return f"{spans / 1e6:.1f}m".replace(".", "_")
    return f"{spans // 1000}k"


@dataclass
class Fill:
    """What one fill measured: spans/s (wall and per CPU-second of this process) over its
    first tenth (an empty database) and its last (N stored), and the spans sent."""

    empty_rate: float
    full_rate: float
    empty_cpu_rate: float
    full_cpu_rate: float
    sent: int


def fill(
    client: TestClient,
    batches: Batches,
    stop_after_s: float = float("inf"),
    profile: tuple[Path, str] | None = None,
) -> Fill:
    """Sends every batch (or those sent within stop_after_s), timing each CHUNK-span stretch.

    The CPU rate counts this process's CPU (the backend's app, its test client and the
    bodies' rewriting): unlike the wall rate it holds when neighbours load the machine.
    With `profile` (a folder, a name), py-spy records this process over the fill's first and
    last tenth (bench/common/profiles.py), and the two are compared when it ends."""
    per_chunk = max(1, CHUNK // batches.spans)
    tenth = max(1, math.ceil(batches.count * ENDS))
    spies = _end_spies(profile)
    stretches: list[tuple[int, float, float]] = []  # (spans, wall s, CPU s)
    started, cpu_started = time.perf_counter(), time.process_time()
    sent, last_report = 0, time.monotonic()
    deadline = time.monotonic() + stop_after_s
    for batch in range(batches.count):
        if time.monotonic() > deadline and batch % per_chunk == 0:
            print(f"  stopped after {stop_after_s:.0f} s at {sent:,} spans", flush=True)
            break
        if spies and batch in (0, batches.count - tenth):
            spies["first" if batch == 0 else "last"].start()
        if spies and batch == tenth:
            spies["first"].stop("first tenth")
        body = batches.body(batch)  # about 2 ms, timed with the batch it builds
        response = client.post("/v1/traces", content=body, headers=PROTOBUF)
        if response.status_code != 200:
            raise SystemExit(f"batch {batch} refused: {response.status_code} {response.text}")
        sent += batches.spans
        in_stretch = batch % per_chunk + 1
        if in_stretch == per_chunk or batch + 1 == batches.count:
            spans = in_stretch * batches.spans
            wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
            stretches.append((spans, wall, max(cpu, 1e-9)))
            started, cpu_started = time.perf_counter(), time.process_time()
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            spans, wall, cpu = stretches[-1] if stretches else (0, 1.0, 1.0)
            wall_rate, cpu_rate = spans / wall, spans / cpu
            print(
                f"  {sent:>10,} spans stored, this stretch {wall_rate:,.0f}/s"
                f" ({cpu_rate:,.0f}/CPU-s), load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    if spies:
        _compare_ends(spies)
    first, last = end_rates(stretches), end_rates(stretches[::-1])
    return Fill(first[0], last[0], first[1], last[1], sent)


def _end_spies(profile: tuple[Path, str] | None) -> dict[str, PySpy]:
    if profile is None:
        return {}
    folder, name = profile
    return {end: PySpy(os.getpid(), folder / f"{name}-{end}.raw") for end in ("first", "last")}


def _compare_ends(spies: dict[str, PySpy]) -> None:
    """Where the last tenth's time went against the first's, per second of each."""
    spies["first"].stop("first tenth")  # a fill of fewer than ten batches ends inside it
    last = spies["last"].stop("last tenth")
    first = spies["first"].raw.with_suffix(".json")
    if last is None or not first.exists():
        print("  profile: py-spy recorded nothing (is it installed, may it read this process?)")
        return
    print("  profile, last tenth against first (py-spy, every thread):")
    print(compare(last, first))


def end_rates(stretches: list[tuple[int, float, float]]) -> tuple[float, float]:
    """(spans/s, spans/CPU-s) over the leading stretches that hold ENDS of all spans."""
    want = ENDS * sum(spans for spans, _, _ in stretches)
    spans = wall = cpu = 0.0
    for stretch_spans, stretch_wall, stretch_cpu in stretches:
        spans, wall, cpu = spans + stretch_spans, wall + stretch_wall, cpu + stretch_cpu
        if spans >= want:
            break
    return spans / wall, spans / cpu


def database_bytes(url: str) -> int:
    """The SQLite file with its WAL, or PostgreSQL's database size (tables, indexes, TOAST)."""
    if url.startswith("sqlite:///"):
        path = Path(url.removeprefix("sqlite:///"))
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            return int(stored_bytes(engine, session))  # what /metrics reports
    finally:
        engine.dispose()


def run(
    database: str,
    url: str,
    spans: int,
    samples: int,
    stop_after_s: float = float("inf"),
    profile: Path | None = None,
) -> None:
    settings = Settings(database_url=url, ingest_workers=0, retention_max_spans=10**12, token=TOKEN)
    batches = Batches(spans)
    print(f"{database}: {batches.count * batches.spans:,} spans in {batches.count} batches")
    headers = {"Authorization": f"Bearer {TOKEN}"}
    server = postmaster(url) if database == "postgres" else None
    server_cpu = cpu_seconds([], server)[1]
    with TestClient(create_app(settings), headers=headers) as client:
        cpu, wall = time.process_time(), time.perf_counter()
        filled = fill(client, batches, stop_after_s, (profile, database) if profile else None)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        server_cpu = cpu_seconds([], server)[1] - server_cpu
        sent = filled.sent
        # The size asked for (10m, not 9_9m), or the size reached when stopped early.
        reached = spans if sent >= batches.count * batches.spans else sent
        label = f"{database}_{{}}_{size_label(reached)}"
        ratio = filled.full_rate / filled.empty_rate
        cpu_ratio = filled.full_cpu_rate / filled.empty_cpu_rate
        load = "/".join(f"{x:.1f}" for x in os.getloadavg())
        note = f"{sent:,} spans; first and last tenth of one run; load {load}"
        print(
            f"  ingest: empty {filled.empty_rate:,.0f}/s, at {sent:,} {filled.full_rate:,.0f}/s"
            f" ({ratio:.2f}); per CPU-second {filled.empty_cpu_rate:,.0f} and"
            f" {filled.full_cpu_rate:,.0f} ({cpu_ratio:.2f})"
        )
        target = f">= {TARGET_INGEST_RATIO}"
        record(BENCH, label.format("ingest") + "_over_empty", ratio, "ratio", target, note)
        record(BENCH, label.format("ingest_cpu") + "_over_empty", cpu_ratio, "ratio", "", note)
        record(BENCH, label.format("ingest_spans_per_s"), filled.full_rate, "spans/s", "", note)
        record(
            BENCH,
            label.format("ingest_spans_per_cpu_s"),
            filled.full_cpu_rate,
            "spans/CPU-s",
            "",
            note,
        )
        if server is not None:  # the database's own CPU, which the figures above leave out
            both = filled.sent / (cpu + server_cpu)
            print(
                f"  whole fill: {filled.sent / wall:,.0f} spans/s; CPU {cpu:,.0f} s here and "
                f"{server_cpu:,.0f} s in the server: {both:,.0f} spans per CPU-second of both"
            )
            whole = f"{filled.sent:,} spans, the whole fill; server on this machine"
            record(
                BENCH, label.format("spans_per_cpu_s_with_server"), both, "spans/CPU-s", "", whole
            )
        for name, (p50, p95) in reads(client, samples, batches.end_ns).items():
            print(f"  {name}: p50 {p50:.1f} ms, p95 {p95:.1f} ms")
            stored = f"{sent:,} spans stored; p50 {p50:.1f} ms"
            record(
                BENCH,
                label.format(f"{name}_p95_ms"),
                p95,
                "ms",
                f"<= {TARGET_P95_MS:.0f} ms",
                stored,
            )
    # The window the summary's reads held: the stream's last 300 s, to now.
    spans, p95 = count_ways(url, samples, batches.end_ns - 300 * 10**9, time.time_ns())
    print(
        f"  window's span count ({spans:,} spans): COUNT(*) p95 {p95['table']:.1f} ms, "
        f"rollups p95 {p95['rollups']:.1f} ms"
    )
    counted = f"{spans:,} spans in the summary's window; alternating, {samples} each"
    for way, value in p95.items():
        record(BENCH, label.format(f"window_count_{way}_p95_ms"), value, "ms", "", counted)
    size = database_bytes(url)
    print(f"  database: {size / 2**20:,.0f} MiB, {size / sent:,.0f} bytes per span")
    record(BENCH, label.format("bytes_per_span"), size / sent, "bytes", "", note)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=10_000_000, help="spans to store")
    parser.add_argument("--samples", type=int, default=100, help="timed reads of each kind")
    parser.add_argument(
        "--postgres",
        metavar="SERVER_URL",
        default=os.environ.get("KVSCOPE_BENCH_POSTGRES_URL"),
        help="also a PostgreSQL server: filled in a database of its own, dropped afterwards",
    )
    parser.add_argument(
        "--with-postgres",
        action="store_true",
        help="also PostgreSQL: --postgres's server, or else a throwaway one (scripts/postgres.sh)",
    )
    parser.add_argument("--workdir", help="where the SQLite file goes (default: a temp dir)")
    parser.add_argument(
        "--stop-after-s",
        type=float,
        default=float("inf"),
        help="stop filling after this long and measure at the size reached (a busy machine)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="record the fill's first and last tenth with py-spy into this folder, and compare",
    )
    arguments = parser.parse_args(argv)
    sizes = (arguments.spans, arguments.samples, arguments.stop_after_s)
    with tempfile.TemporaryDirectory(dir=arguments.workdir) as folder:
        url = f"sqlite:///{folder}/scale.db"
        run("sqlite", url, *sizes, arguments.profile)
    if not (arguments.postgres or arguments.with_postgres):
        return
    with ExitStack() as stack:
        server_url = arguments.postgres or stack.enter_context(started_server())
        name = f"kvscope_scale_{uuid.uuid4().hex[:8]}"
        url = stack.enter_context(fresh_database(server_url, name))
        print(f"postgres: database {name}, {durability(server_url)}")
        run("postgres", url, *sizes, arguments.profile)


if __name__ == "__main__":
    main()
