"""Sizing page charts: replayed hit rate and predicted TTFT against host pool size, a line a
policy, with the infinite-pool ceiling and each policy's knee marked."""

import altair as alt
import pandas as pd

HEIGHT = 280
QUANTILES = {"predicted TTFT p50 ms": "p50", "predicted TTFT p95 ms": "p95"}
CEILING_COLOR = "#555"
X = alt.X("pool blocks:Q", scale=alt.Scale(type="log"), title="host pool blocks")


def hit_rate_chart(curve: pd.DataFrame, ceiling: dict) -> alt.LayerChart | alt.FacetChart:
    """Hit rate against pool size; the ceiling as a dashed level and a dashed size, each knee
    as a diamond on its policy's line."""
    rate = round(100 * ceiling["pool_hit_rate"], 2)
    lines = _lines(curve, "pool hit rate %")
    level = _rule(pd.DataFrame({"pool hit rate %": [rate]}), y="pool hit rate %:Q")
    size = _rule(pd.DataFrame({"pool blocks": [ceiling["pool_blocks"]]}), x="pool blocks:Q")
    label = (
        alt.Chart(pd.DataFrame({"pool blocks": [ceiling["pool_blocks"]], "y": [rate]}))
        .mark_text(align="left", dx=4, dy=-6, color=CEILING_COLOR)
        .encode(x=X, y="y:Q", text=alt.value("ceiling"))
    )
    return alt.layer(lines, _knees(curve, "pool hit rate %"), level, size, label).properties(
        height=HEIGHT
    )


def ttft_chart(
    curve: pd.DataFrame, measured_p50_ms: float | None
) -> alt.LayerChart | alt.FacetChart:
    """Predicted TTFT p50 (solid) and p95 (dashed) against pool size, each knee a diamond on
    the p50 line; today's measured p50 as a dashed level."""
    quantiles = curve.melt(
        id_vars=["policy", "pool blocks", "point"],
        value_vars=list(QUANTILES),
        var_name="quantile",
        value_name="predicted TTFT ms",
    ).dropna(subset=["predicted TTFT ms"])
    quantiles["quantile"] = quantiles["quantile"].map(QUANTILES)
    lines = (
        alt.Chart(quantiles)
        .mark_line(point=True)
        .encode(
            x=X,
            y=alt.Y("predicted TTFT ms:Q", title="predicted TTFT ms"),
            color=alt.Color("policy:N", title=None),
            strokeDash=alt.StrokeDash("quantile:N", title=None),
            tooltip=["policy:N", "quantile:N", "pool blocks:Q", "predicted TTFT ms:Q"],
        )
    )
    layers = [lines, _knees(curve, "predicted TTFT p50 ms")]
    if measured_p50_ms is not None:
        today = pd.DataFrame({"predicted TTFT ms": [measured_p50_ms]})
        layers.append(_rule(today, y="predicted TTFT ms:Q"))
    return alt.layer(*layers).properties(height=HEIGHT)


def _lines(curve: pd.DataFrame, y: str) -> alt.Chart:
    return (
        alt.Chart(curve.dropna(subset=[y]))
        .mark_line(point=True)
        .encode(
            x=X,
            y=alt.Y(f"{y}:Q", title=y),
            color=alt.Color("policy:N", title=None),
            tooltip=["policy:N", "point:N", "pool blocks:Q", f"{y}:Q"],
        )
    )


def _knees(curve: pd.DataFrame, y: str) -> alt.Chart:
    knees = curve[curve["point"] == "knee"].dropna(subset=[y])
    return (
        alt.Chart(knees)
        .mark_point(shape="diamond", size=160, filled=True)
        .encode(
            x=X,
            y=f"{y}:Q",
            color=alt.Color("policy:N", title=None),
            tooltip=["policy:N", "point:N", "pool blocks:Q", f"{y}:Q"],
        )
    )


def _rule(frame: pd.DataFrame, **encoding) -> alt.Chart:
    return alt.Chart(frame).mark_rule(strokeDash=[4, 4], color=CEILING_COLOR).encode(**encoding)
