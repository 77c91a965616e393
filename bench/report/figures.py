"""The figures the report expects, in table order: bench, metric, unit, target (one place).

Naming (for benches calling `kvscope.bench.results.record`):

- `bench` is the bench's module name under `kvscope.bench` (`copy_bandwidth`, `soak`).
- `metric` is snake_case; a ratio is named `<what>_over_<baseline>` and has unit "ratio"; an
  absolute figure ends with its unit (`timeline_p95_ms`, `idle_cpu_owner_pct`).
- The target here wins over the one a bench records; a figure a bench records that is not
  listed here still appears in the report, under "Other recorded figures".

To match a bench's own names, either rename the row below or add the bench's name to
ALIASES; nothing else in the report needs to change.
"""

import math
import operator
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One row of the report's table."""

    bench: str
    metric: str
    unit: str
    target: str  # ">= 0.9", "<= 50", "== 0"; "" for a figure shown without a verdict
    label: str  # what the figure is, in words
    sizes: str = "any"
    """"quick" or "full" for a figure only runs of that size record (a bench's quick run uses
    another model or fewer lengths); such a row is left out of the other size's report."""


FIGURES: list[Figure] = [
    Figure(
        "tracing_overhead",
        "tokens_per_s_aggregated_over_untraced",
        "ratio",
        ">= 0.99",
        "tokens/s with TracedConnector (aggregated layer spans) over untraced",
    ),
    Figure(
        "tracing_overhead",
        "tokens_per_s_aggregated_over_both_untraced",
        "ratio",
        ">= 0.99",
        "tokens/s with TracedConnector (aggregated) over the mean of both untraced arms",
    ),
    Figure(
        "tracing_overhead",
        "tokens_per_s_control_over_untraced",
        "ratio",
        "",
        "tokens/s of the untraced arm over itself (the control arm): the run's noise",
    ),
    Figure(
        "tracing_overhead",
        "tokens_per_s_per_layer_over_untraced",
        "ratio",
        ">= 0.98",
        "tokens/s with TracedConnector (a span per layer) over untraced",
    ),
    Figure(
        "tracing_overhead",
        "tokens_per_cpu_s_aggregated_over_untraced",
        "ratio",
        "",
        "tokens per CPU-second, aggregated spans over untraced",
    ),
    Figure(
        "tracing_overhead",
        "tokens_per_cpu_s_per_layer_over_untraced",
        "ratio",
        "",
        "tokens per CPU-second, per-layer spans over untraced",
    ),
    Figure("tracing_overhead", "span_cost_us", "us", "", "median cost of one hook-like span"),
    Figure(
        "tracing_overhead",
        "span_cost_sdk_bare_us",
        "us",
        "",
        "median cost of a bare OTel SDK span (start and end, no attributes)",
    ),
    Figure(
        "tracing_overhead",
        "span_cost_sdk_attributes_us",
        "us",
        "",
        "median cost of an OTel SDK span with a hook's attributes",
    ),
    Figure(
        "tracing_overhead",
        "span_cost_hook_us",
        "us",
        "",
        "median cost of a kvscope hook span (context made current, attributes built)",
    ),
    Figure(
        "copy_bandwidth",
        "store_over_raw_contiguous",
        "ratio",
        ">= 0.95",
        "offload store bandwidth over a raw torch copy, contiguous blocks",
    ),
    Figure(
        "copy_bandwidth",
        "load_over_raw_contiguous",
        "ratio",
        ">= 0.95",
        "offload load bandwidth over a raw torch copy, contiguous blocks",
    ),
    Figure(
        "copy_bandwidth",
        "store_over_raw_scattered",
        "ratio",
        ">= 0.95",
        "offload store bandwidth over a raw torch copy, scattered blocks",
    ),
    Figure(
        "copy_bandwidth",
        "load_over_raw_scattered",
        "ratio",
        ">= 0.95",
        "offload load bandwidth over a raw torch copy, scattered blocks",
    ),
    Figure(
        "nixl_bandwidth",
        "read_over_raw_progress_thread",
        "ratio",
        ">= 0.8",
        "P2P READ bandwidth over raw NIXL (progress thread)",
    ),
    Figure(
        "nixl_bandwidth",
        "read_over_raw_poll_1ms",
        "ratio",
        ">= 0.8",
        "P2P READ bandwidth over raw NIXL (owner polled every 1 ms)",
    ),
    Figure(
        "nixl_bandwidth",
        "idle_cpu_owner_pct",
        "% of a core",
        "",
        "idle CPU of the P2P owner (agent, poller, side channel)",
    ),
    Figure(
        "offload_ttft",
        "ttft_hit_over_recompute_1k",
        "ratio",
        "",
        "TTFT with a 1k-token prefix from the offload pool over recompute, mid model",
        "full",
    ),
    Figure(
        "offload_ttft",
        "ttft_hit_over_recompute_mid",
        "ratio",
        "<= 0.1",
        "TTFT with a 2k-token prefix from the offload pool over recompute, mid model",
    ),
    Figure(
        "offload_ttft",
        "ttft_hit_over_recompute_4k",
        "ratio",
        "",
        "TTFT with a 4k-token prefix from the offload pool over recompute, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "ttft_over_single_1k",
        "ratio",
        "",
        "TTFT through kvscope's P/D pair over one server alone, 1k-token prompts, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "ttft_over_single_mid",
        "ratio",
        "<= 1.2",
        "TTFT through kvscope's P/D pair over one server alone, 2k-token prompts, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "ttft_over_single_4k",
        "ratio",
        "",
        "TTFT through kvscope's P/D pair over one server alone, 4k-token prompts, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "ttft_over_stock_mid",
        "ratio",
        "<= 0.5",
        "TTFT, kvscope's P/D pair over vLLM's stock pair, 2k-token prompts, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "total_over_stock_mid",
        "ratio",
        "<= 0.5",
        "whole-request time, kvscope's P/D pair over the stock pair, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "ttft_pinned_over_stock_mid",
        "ratio",
        "<= 0.5",
        "TTFT, kvscope's pair pinned one core per server over the stock pair, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "ttft_over_stock_uniproc_mid",
        "ratio",
        "",
        "TTFT, kvscope's pair over the stock pair with kvscope's executor setting, mid model",
        "full",
    ),
    Figure(
        "pd_latency",
        "ttft_over_single",
        "ratio",
        "<= 1.5",
        "TTFT through kvscope's P/D pair over one server alone (tiny model, short prompts)",
        "quick",
    ),
    Figure(
        "pd_latency",
        "ttft_over_stock",
        "ratio",
        "<= 0.5",
        "TTFT through kvscope's P/D pair over vLLM's stock NixlConnector pair",
        "quick",
    ),
    Figure(
        "pd_latency",
        "total_over_stock",
        "ratio",
        "<= 0.5",
        "whole-request time, kvscope's P/D pair over the stock pair",
        "quick",
    ),
    Figure(
        "pd_latency",
        "ttft_pinned_over_stock",
        "ratio",
        "<= 0.5",
        "TTFT, kvscope's pair pinned one core per server over the stock pair (pinned)",
        "quick",
    ),
    Figure(
        "pd_latency",
        "ttft_over_stock_uniproc",
        "ratio",
        "",
        "TTFT, kvscope's pair over the stock pair with kvscope's executor setting (pinned)",
        "quick",
    ),
    Figure(
        "pd_latency",
        "total_over_stock_uniproc",
        "ratio",
        "",
        "whole-request time, kvscope's pair over the stock pair with kvscope's setting",
        "quick",
    ),
    Figure(
        "pd_latency", "idle_cpu_ours_pct", "% of a core", "< 5", "idle CPU of kvscope's P/D pair"
    ),
    Figure(
        "pd_latency",
        "idle_cpu_plain_pct",
        "% of a core",
        "",
        "idle CPU of two plain vLLM servers (no connector): vLLM's own floor",
    ),
    Figure(
        "pd_latency",
        "idle_cpu_ours_minus_plain_pct",
        "% of a core",
        "< 5",
        "idle CPU kvscope's pair adds over the plain pair",
    ),
    Figure(
        "pd_latency",
        "idle_cpu_stock_pinned_pct",
        "% of a core",
        "",
        "idle CPU of vLLM's stock NixlConnector pair (pinned)",
    ),
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
    Figure(
        "soak",
        "token_mismatches",
        "count",
        "== 0",
        "soak requests whose greedy tokens differ from a reference engine's",
    ),
    Figure(
        "scale",
        "sqlite_ingest_10m_over_empty",
        "ratio",
        ">= 0.9",
        "SQLite ingest rate with 10M spans stored over an empty database (bench.scale)",
    ),
    Figure(
        "scale",
        "sqlite_timeline_p95_ms_10m",
        "ms",
        "<= 50",
        "a request's timeline p95 with 10M spans stored, SQLite",
    ),
    Figure(
        "scale",
        "sqlite_summary_p95_ms_10m",
        "ms",
        "<= 50",
        "the overview's summary p95 with 10M spans stored, SQLite",
    ),
    Figure(
        "scale",
        "sqlite_series_p95_ms_10m",
        "ms",
        "<= 50",
        "the overview's time series p95 with 10M spans stored, SQLite",
    ),
    Figure(
        "scale",
        "sqlite_bytes_per_span_10m",
        "bytes",
        "",
        "database bytes per stored span at 10M spans, SQLite",
    ),
    Figure("soak", "leaks", "count", "== 0", "blocks or leases still held once the soak drained"),
    Figure("soak", "hung", "count", "== 0", "soak requests that never ended"),
    Figure(
        "soak",
        "rebuilt_state_unexplained",
        "count",
        "== 0",
        "differences between the backend's rebuilt state and the servers' own",
    ),
    Figure(
        "soak",
        "leases_missing_in_backend",
        "count",
        "== 0",
        "leases the servers held that the backend never learnt of",
    ),
    Figure(
        "soak",
        "requests_per_s",
        "req/s",
        "",
        "completed soak requests per second (P/D + offload, faults on)",
    ),
    Figure(
        "soak",
        "faulted_over_clean_req_per_s",
        "ratio",
        ">= 0.5",
        "completed soak req/s with loads slower than their timeout over the clean phase before",
    ),
    Figure(
        "soak",
        "faulted_req_per_s",
        "req/s",
        "",
        "completed soak req/s with loads slower than their timeout (tier-health breaker on)",
    ),
    Figure(
        "soak",
        "clean_req_per_s",
        "req/s",
        "",
        "completed soak req/s in the clean phase right before the slow-load one",
    ),
    *(
        Figure(
            "soak",
            f"rss_growth_mib_{service}",
            "MiB",
            "<= 256",
            f"{service} memory growth over the soak's second half",
        )
        for service in ("prefill", "decode", "backend", "proxy")
    ),
]

ALIASES: dict[tuple[str, str], str] = {}
"""(bench, metric as the bench records it) -> the metric name in FIGURES."""

_TARGET = re.compile(r"^\s*(>=|<=|==|>|<)\s*([-+]?[0-9][0-9_,]*(?:\.[0-9]*)?(?:[eE][-+]?\d+)?)")
_COMPARE = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}


def canonical(bench: str, metric: str) -> str:
    """The FIGURES name of a metric a bench recorded."""
    return ALIASES.get((bench, metric), metric)


def target_bound(target: str) -> float | None:
    """The number in a target such as ">= 0.9"; None when the target has none."""
    match = _TARGET.match(target or "")
    return float(match.group(2).replace(",", "").replace("_", "")) if match else None


def target_met(value: float, target: str) -> bool | None:
    """Whether value meets a target such as ">= 0.9"; None when the target says nothing."""
    bound = target_bound(target)
    if bound is None:
        return None
    if math.isnan(value):
        return False
    return _COMPARE[_TARGET.match(target).group(1)](value, bound)
