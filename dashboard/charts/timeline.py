"""One request's timeline: a Gantt chart of its spans by lane, the KV points, TTFT parts."""

import altair as alt
import pandas as pd

from kvscope.dashboard.charts.format import short_id
from kvscope.traces import names

SIDES = {"kv_producer": "prefill", "kv_consumer": "decode"}
KIND_COLORS = {
    "request": "#bab0ac",
    "hook": "#4c78a8",
    "worker": "#72b7b2",
    "transfer": "#54a24b",
    "failed transfer": "#e45756",
    "event": "#b279a2",
    "other": "#9d755d",
}
# A 20 µs hook in a 400 ms request is below a pixel: bars get this share of the view at least.
MIN_BAR_SHARE = 0.004
TTFT_PARTS = {"queue_ms": "queue", "lookup_ms": "lookup", "kv_wait_ms": "KV wait"}


def _inherited(span: dict | None, by_id: dict[str, dict], key: str):
    """An attribute from the span or its nearest ancestor (transfers carry no engine role)."""
    seen = 0
    while span is not None and seen < 64:
        value = span["attributes"].get(key)
        if value is not None:
            return value
        span, seen = by_id.get(span.get("parent_span_id") or ""), seen + 1
    return None


def _kind(span: dict) -> str:
    name = span["name"]
    if name == names.SPAN_TRANSFER:
        ok = span["attributes"].get(names.TRANSFER_OK, True) and span["status_code"] != 2
        return "transfer" if ok else "failed transfer"
    if name.startswith(names.SPAN_HOOK_PREFIX):
        return "hook"
    return {
        names.SPAN_REQUEST: "request",
        names.SPAN_WORKER_REQUEST: "worker",
        names.SPAN_REQUEST_EVENT: "event",
    }.get(name, "other")


def _lane(span: dict, by_id: dict, engines: set[str]) -> str:
    kv_role = _inherited(span, by_id, names.KV_ROLE)
    engine = _inherited(span, by_id, names.ENGINE_ID) or span.get("engine_id")
    side = SIDES.get(kv_role) or ("engine" if len(engines) <= 1 else f"engine {short_id(engine)}")
    kind = _kind(span)
    if kind in ("transfer", "failed transfer"):
        return f"{side} · transfer"
    if kind == "request":
        return f"{side} · request"
    role = _inherited(span, by_id, names.CONNECTOR_ROLE) or span.get("service_name") or "other"
    return f"{side} · {role}"


def _label(name: str) -> str:
    return name.removeprefix(names.SPAN_HOOK_PREFIX).removeprefix("kvscope.")


def gantt_frame(spans: list[dict], origin_ns: int) -> pd.DataFrame:
    """One bar per span: lane, label, start/end in ms from origin_ns, true duration."""
    columns = ["lane", "span", "kind", "start_ms", "end_ms", "shown_end_ms", "duration_ms"]
    if not spans:
        return pd.DataFrame(columns=columns)
    by_id = {span["span_id"]: span for span in spans}
    engines = {e for s in spans if (e := _inherited(s, by_id, names.ENGINE_ID))}
    last_ns = max(span["end_ns"] for span in spans)
    min_ms = max((last_ns - origin_ns) / 1e6 * MIN_BAR_SHARE, 0.001)
    rows = []
    for span in spans:
        start_ms = (span["start_ns"] - origin_ns) / 1e6
        end_ms = (span["end_ns"] - origin_ns) / 1e6
        rows.append(
            {
                "lane": _lane(span, by_id, engines),
                "span": _label(span["name"]),
                "kind": _kind(span),
                "start_ms": round(start_ms, 3),
                "end_ms": round(end_ms, 3),
                "shown_end_ms": round(max(end_ms, start_ms + min_ms), 3),
                "duration_ms": round(end_ms - start_ms, 3),
            }
        )
    return pd.DataFrame(rows, columns=columns)


def points_frame(timeline: dict, origin_ns: int) -> pd.DataFrame:
    """The request's KV timeline points (lookup_start ... finished) in ms from origin_ns."""
    rows = [
        {
            "point": point["point"] + (f" L{point['layer']}" if point["layer"] is not None else ""),
            "at_ms": round((point["time_ns"] - origin_ns) / 1e6, 3),
            "value": point["value"],
        }
        for point in timeline["points"]
    ]
    return pd.DataFrame(rows, columns=["point", "at_ms", "value"])


def gantt_chart(bars: pd.DataFrame, points: pd.DataFrame) -> alt.LayerChart | alt.FacetChart:
    lanes = sorted(bars["lane"].unique(), key=_lane_order)
    x = alt.X("start_ms:Q", title="ms since the request started")
    spans = (
        alt.Chart(bars)
        .mark_bar(size=14)
        .encode(
            x=x,
            x2="shown_end_ms:Q",
            y=alt.Y("lane:N", sort=lanes, title=None),
            color=alt.Color(
                "kind:N",
                scale=alt.Scale(domain=list(KIND_COLORS), range=list(KIND_COLORS.values())),
                legend=alt.Legend(orient="top", title=None),
            ),
            tooltip=["span:N", "lane:N", "start_ms:Q", "duration_ms:Q"],
        )
    )
    marks = (
        alt.Chart(points)
        .mark_rule(strokeDash=[3, 3], color="#555")
        .encode(x="at_ms:Q", tooltip=["point:N", "at_ms:Q", "value:Q"])
    )
    return alt.layer(marks, spans).properties(height=110 + 36 * len(lanes))


def _lane_order(lane: str) -> tuple:
    side, _, part = lane.partition(" · ")
    parts = ["request", "scheduler", "worker", "transfer"]
    sides = ["prefill", "decode"]
    return (
        sides.index(side) if side in sides else 2,
        side,
        parts.index(part) if part in parts else 9,
    )


def ttft_frame(ttft: dict) -> pd.DataFrame:
    """TTFT split into queue, lookup, KV wait and compute (ms), with where each came from."""
    sources = ttft.get("sources", {})
    parts = {**TTFT_PARTS, "compute_ms": "compute"}
    rows = [
        {"part": label, "ms": round(ttft[key], 3), "from": sources.get(key, "")}
        for key, label in parts.items()
        if ttft.get(key) is not None
    ]
    return pd.DataFrame(rows, columns=["part", "ms", "from"])


def ttft_chart(parts: pd.DataFrame) -> alt.Chart:
    order = ["queue", "lookup", "KV wait", "compute"]
    return (
        alt.Chart(parts)
        .mark_bar(size=28)
        .encode(
            x=alt.X("sum(ms):Q", title="ms", stack="zero"),
            color=alt.Color("part:N", sort=order, legend=alt.Legend(orient="top", title=None)),
            y=alt.Y("bar:N", title=None),
            order=alt.Order("order:Q"),
            tooltip=["part:N", "ms:Q", "from:N"],
        )
        .transform_calculate(order=f"indexof({order}, datum.part)", bar="'TTFT'")
        .properties(height=120)
    )
