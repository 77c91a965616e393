"""Expected figures of the backend's benches: ingest, telemetry isolation, 10M spans, scale-out."""

from kvscope.bench.report.figures.figure import Figure

_SHARED = "clients, backends and PostgreSQL share one machine (its cores in the note)"

BACKEND_FIGURES: list[Figure] = [
    Figure(
        "ingest",
        "sqlite_spans_per_s",
        "spans/s",
        ">= 20000",
        "backend ingest rate on SQLite, wall clock (client and backend share the cores)",
    ),
    Figure(
        "ingest",
        "sqlite_spans_per_backend_cpu_s",
        "spans/CPU-s",
        ">= 30000",
        "backend ingest per backend CPU-second on SQLite (what one free core sustains)",
    ),
    Figure(
        "ingest",
        "sqlite_backend_cpu_over_client_cpu",
        "ratio",
        "",
        "SQLite ingest, backend CPU per span over the OTel exporter clients' (the same client "
        "work in every run: the shared machine's speed cancels out)",
    ),
    Figure(
        "ingest",
        "sqlite_timeline_p95_ms",
        "ms",
        "<= 50",
        "timeline query p95 with the bench's spans stored, SQLite",
    ),
    Figure(
        "ingest",
        "sqlite_otel_workers_over_in_process",
        "ratio",
        "",
        "SQLite ingest rate, 2 ingest worker processes over none (OTel exporter clients)",
    ),
    Figure(
        "ingest",
        "sqlite_replay_workers_spans_per_s",
        "spans/s",
        "",
        "SQLite ingest rate with 2 ingest workers and replaying clients: the backend's "
        "capacity when clients cost almost nothing",
    ),
    Figure(
        "ingest",
        "sqlite_replay_workers_over_in_process",
        "ratio",
        "",
        "SQLite ingest rate, 2 ingest worker processes over none (replaying clients)",
    ),
    Figure(
        "telemetry_isolation",
        "tokens_per_s_down_over_up",
        "ratio",
        ">= 0.98",
        "engine tokens/s with backend and Jaeger down over both up",
    ),
    Figure(
        "telemetry_isolation",
        "tokens_per_s_slow_over_up",
        "ratio",
        ">= 0.98",
        "engine tokens/s with backend and Jaeger slow over both up",
    ),
    Figure(
        "telemetry_isolation",
        "spans_dropped_up",
        "spans",
        "== 0",
        "spans dropped while both destinations answered",
    ),
    Figure(
        "telemetry_isolation",
        "spans_dropped_down",
        "spans",
        "",
        "spans dropped with both destinations down",
    ),
    Figure(
        "telemetry_isolation",
        "spans_dropped_slow",
        "spans",
        "",
        "spans dropped with both destinations slow",
    ),
    *(
        Figure("scale", f"{database}_{metric}_10m{suffix}", unit, target, f"{what}, {name}")
        for database, name in (("sqlite", "SQLite"), ("postgres", "PostgreSQL"))
        for metric, suffix, unit, target, what in (
            (
                "ingest",
                "_over_empty",
                "ratio",
                ">= 0.9",
                "ingest rate of a 10M-span fill's last tenth over its first tenth's (bench.scale)",
            ),
            (
                "timeline_p95_ms",
                "",
                "ms",
                "<= 50",
                "a request's timeline p95 with 10M spans stored",
            ),
            (
                "summary_p95_ms",
                "",
                "ms",
                "<= 50",
                "the overview's summary p95 with 10M spans stored",
            ),
            ("series_p95_ms", "", "ms", "<= 50", "the overview's time series p95 with 10M spans"),
            ("bytes_per_span", "", "bytes", "", "database bytes per stored span at 10M spans"),
        )
    ),
    Figure(
        "scale",
        "postgres_spans_per_cpu_s_with_server_10m",
        "spans/CPU-s",
        "",
        "spans per CPU-second of the backend and the PostgreSQL server together, 10M-span fill",
    ),
    *(
        Figure(
            "scale_out",
            f"spans_per_s_{n}_backends_over_1",
            "ratio",
            "",
            f"aggregate ingest spans/s, {n} backends sharing one PostgreSQL over 1; {_SHARED}",
        )
        for n in (2, 4)
    ),
    *(
        Figure("scale_out", f"{metric}_{count}", unit, target, f"{what}, {count.replace('_', ' ')}")
        for metric, unit, target, what in (
            ("spans_per_s", "spans/s", "", f"aggregate ingest spans/s; {_SHARED}"),
            ("spans_per_backend_cpu_s", "spans/CPU-s", "", "spans per backend CPU-second"),
            ("spans_per_postgres_cpu_s", "spans/CPU-s", "", "spans per PostgreSQL CPU-second"),
            ("spans_missing", "spans", "== 0", "spans sent but not in the shared database"),
        )
        for count in ("1_backend", "2_backends", "4_backends")
    ),
]
"""ingest, telemetry_isolation, scale and scale_out, in table order."""
