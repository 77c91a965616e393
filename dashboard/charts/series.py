"""Overview series: hit rate, bytes/s per path, leases held, failures per cause, TTFT and its
KV wait over time, from the backend's /api/v1/stats/series (pure functions, unit-tested)."""

import altair as alt
import pandas as pd

from kvscope.dashboard.charts.overview import PATH_LABELS

HEIGHT = 180
TTFT_MEASURES = {
    "ttft_p50_ms": "TTFT p50",
    "ttft_p95_ms": "TTFT p95",
    "kv_wait_p50_ms": "KV wait p50",
    "kv_wait_p95_ms": "KV wait p95",
}


def _time(time_ns: int) -> pd.Timestamp:
    return pd.Timestamp(time_ns, unit="ns", tz="UTC")


def hit_rate_frame(series: dict) -> pd.DataFrame:
    """External hit tokens as a share of prompt tokens, per step with lookups."""
    rows = [
        {"time": _time(p["time_ns"]), "hit rate %": round(100 * p["hit_rate"], 1)}
        for p in series.get("hits", [])
        if p["hit_rate"] is not None
    ]
    return pd.DataFrame(rows, columns=["time", "hit rate %"])


def bytes_frame(series: dict) -> pd.DataFrame:
    rows = [
        {
            "time": _time(p["time_ns"]),
            "path": PATH_LABELS.get(p["direction"], p["direction"]),
            "MB/s": round(p["bytes_per_s"] / 1e6, 3),
        }
        for p in series.get("bytes", [])
    ]
    return pd.DataFrame(rows, columns=["time", "path", "MB/s"])


def leases_frame(series: dict) -> pd.DataFrame:
    rows = [{"time": _time(p["time_ns"]), "held": p["held"]} for p in series.get("leases", [])]
    return pd.DataFrame(rows, columns=["time", "held"])


def failures_frame(series: dict) -> pd.DataFrame:
    rows = [
        {"time": _time(p["time_ns"]), "cause": p["cause"], "incidents": p["incidents"]}
        for p in series.get("failures", [])
    ]
    return pd.DataFrame(rows, columns=["time", "cause", "incidents"])


def ttft_frame(series: dict) -> pd.DataFrame:
    """TTFT p50/p95 and the KV-wait part's p50/p95 (ms), one row per measure and step."""
    rows = [
        {"time": _time(p["time_ns"]), "measure": label, "ms": round(p[key], 3)}
        for p in series.get("ttft", [])
        for key, label in TTFT_MEASURES.items()
        if p.get(key) is not None
    ]
    return pd.DataFrame(rows, columns=["time", "measure", "ms"])


def line_chart(frame: pd.DataFrame, y: str, color: str | None = None) -> alt.Chart:
    """One line per color value over time, with points so a lone step still shows."""
    encoding = {
        "x": alt.X("time:T", title=None, axis=alt.Axis(format="%H:%M:%S")),
        "y": alt.Y(f"{y}:Q", title=y),
        "tooltip": ["time:T", f"{y}:Q"],
    }
    if color:
        encoding["color"] = alt.Color(f"{color}:N", title=None)
        encoding["tooltip"] = ["time:T", f"{color}:N", f"{y}:Q"]
    return alt.Chart(frame).mark_line(point=True).encode(**encoding).properties(height=HEIGHT)


def failures_chart(frame: pd.DataFrame) -> alt.Chart:
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("time:T", title=None, axis=alt.Axis(format="%H:%M:%S")),
            y=alt.Y("incidents:Q", title="incidents"),
            color=alt.Color("cause:N", title="cause"),
            tooltip=["time:T", "cause:N", "incidents:Q"],
        )
        .properties(height=HEIGHT)
    )


def charts(series: dict) -> dict[str, alt.Chart | None]:
    """Title -> chart (None: nothing in the window), in the order the overview shows them."""
    frames = {
        "External hit rate": (hit_rate_frame(series), "hit rate %", None),
        "Bytes/s per path": (bytes_frame(series), "MB/s", "path"),
        "Leases held": (leases_frame(series), "held", None),
        "TTFT and its KV wait": (ttft_frame(series), "ms", "measure"),
    }
    found: dict[str, alt.Chart | None] = {
        title: None if frame.empty else line_chart(frame, y, color)
        for title, (frame, y, color) in frames.items()
    }
    failures = failures_frame(series)
    found["Failure incidents per cause"] = None if failures.empty else failures_chart(failures)
    return found
