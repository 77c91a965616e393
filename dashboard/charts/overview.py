"""Overview figures: hit rates, bytes per path, engines, span-stream warnings."""

import pandas as pd

from kvscope.dashboard.charts.format import clock, human_bytes, percent
from kvscope.traces.hit_rate import hit_rate

PATH_LABELS = {
    "store": "device→host store",
    "load": "host→device load",
    "p2p_read": "prefill→decode read",
}
"""Paths by what they join, not by a device kind: on vLLM's CPU platform the "device" KV cache is
CPU memory too, and an operator must not read "GPU" on a machine that has none."""


def paths_frame(summary: dict) -> pd.DataFrame:
    """One row per transfer path (all three always shown), throughput over the window."""
    window_s = summary["window_s"]
    transfers = summary.get("transfers", {})
    directions = list(PATH_LABELS) + sorted(set(transfers) - set(PATH_LABELS))
    rows = []
    for direction in directions:
        stats = transfers.get(direction, {})
        moved = stats.get("bytes", 0)
        rows.append(
            {
                "path": PATH_LABELS.get(direction, direction),
                "transfers": int(stats.get("count", 0)),
                "failed": int(stats.get("failed", 0)),
                "moved": human_bytes(moved),
                "MB/s over window": round(moved / window_s / 1e6, 3),
                "mean GB/s per transfer": round(stats.get("mean_gbps", 0.0), 3),
            }
        )
    return pd.DataFrame(rows)


def hit_rate_frame(hits: list[dict]) -> pd.DataFrame:
    """External hit rate per connector (and MultiConnector child): by request and by token."""
    rows = [
        {
            "connector": hit["connector"] or "unknown",
            "child": hit["child"] or "–",
            "lookups": hit["requests"],
            "requests hit %": percent(hit["hit_requests"], hit["requests"]),
            "tokens hit %": hit_percent(hit["external_hit_tokens"], hit["prompt_tokens"]),
            "external tokens": hit["external_hit_tokens"],
        }
        for hit in hits
    ]
    columns = ["connector", "child", "lookups", "requests hit %", "tokens hit %"]
    return pd.DataFrame(rows, columns=columns + ["external tokens"])


def hit_percent(hit_tokens: int, prompt_tokens: int) -> float | None:
    """traces.hit_rate.hit_rate in percent, to 0.1."""
    rate = hit_rate(hit_tokens, prompt_tokens)
    return None if rate is None else round(100 * rate, 1)


def stream_warnings(streams: list[dict]) -> list[str]:
    """One sentence per process whose span stream lost or has not yet delivered spans."""
    warnings = []
    for stream in streams:
        name = f"{stream.get('service_name') or 'process'} {stream['origin'][:8]}"
        if stream.get("telemetry_dropped"):
            warnings.append(f"{name} dropped {stream['telemetry_dropped']} spans before export")
        missing = sum(h["count"] for h in stream["holes"] if h["state"] == "missing")
        pending = sum(h["count"] for h in stream["holes"] if h["state"] != "missing")
        if missing:
            warnings.append(f"{name}: {missing} spans never arrived (state may be wrong)")
        if pending:
            warnings.append(f"{name}: {pending} spans not yet received (may still arrive)")
    return warnings


def request_total(summary: dict) -> int:
    return sum(summary.get("requests", {}).values())


def engines_frame(engines: list[dict]) -> pd.DataFrame:
    """Engines by service name and role; gone ones say since when they were silent."""
    rows = [
        {
            "engine": engine["label"],
            "service": engine["service_name"] or "–",
            "role": engine["kv_role"] or "–",
            "processes": engine["processes"],
            "state": "gone (engine lost)" if engine["gone"] else "reporting",
            "last heard": clock(engine["last_seen_ns"]),
            "id": engine["engine_id"][:8],
        }
        for engine in engines
    ]
    columns = ["engine", "service", "role", "processes", "state", "last heard", "id"]
    return pd.DataFrame(rows, columns=columns)
