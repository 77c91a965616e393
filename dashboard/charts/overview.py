"""Overview figures: hit rates, bytes per path, failures per minute, span-stream warnings."""

import altair as alt
import pandas as pd

from kvscope.dashboard.charts.format import human_bytes, percent, short_cause

PATH_LABELS = {"store": "GPU→CPU store", "load": "CPU→GPU load", "p2p_read": "P→D read"}


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
            "tokens hit %": percent(hit["external_hit_tokens"], hit["prompt_tokens"]),
            "external tokens": hit["external_hit_tokens"],
        }
        for hit in hits
    ]
    columns = ["connector", "child", "lookups", "requests hit %", "tokens hit %"]
    return pd.DataFrame(rows, columns=columns + ["external tokens"])


def failures_per_minute(failures: list[dict], since_ns: int) -> pd.DataFrame:
    """Failure counts per minute and cause, from since_ns on."""
    rows = [
        {"minute": pd.Timestamp(f["time_ns"], unit="ns", tz="UTC").floor("min"), "cause": c}
        for f in failures
        if f["time_ns"] >= since_ns
        for c in [short_cause(f.get("cause") or f.get("kind"))]
    ]
    if not rows:
        return pd.DataFrame(columns=["minute", "cause", "failures"])
    frame = pd.DataFrame(rows)
    return frame.groupby(["minute", "cause"]).size().reset_index(name="failures")


def failures_chart(per_minute: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(per_minute)
        .mark_bar()
        .encode(
            x=alt.X("minute:T", title="minute", axis=alt.Axis(format="%H:%M")),
            y=alt.Y("failures:Q", title="failures per minute"),
            color=alt.Color("cause:N", title="cause"),
            tooltip=["minute:T", "cause:N", "failures:Q"],
        )
        .properties(height=220)
    )


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
