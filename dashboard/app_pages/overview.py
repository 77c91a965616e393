"""Overview: key figures, series over time, hit rates and bytes per path, engines."""

import time

import streamlit as st

from kvscope.dashboard import client, transport_sections, ui
from kvscope.dashboard.charts import accounting as accounting_charts
from kvscope.dashboard.charts import health
from kvscope.dashboard.charts import misses as misses_charts
from kvscope.dashboard.charts import overview as charts
from kvscope.dashboard.charts import recomputes as recompute_charts
from kvscope.dashboard.charts import series as series_charts
from kvscope.dashboard.charts.format import human_bytes
from kvscope.traces.hit_rate import pooled

st.title("Overview")
window_s = ui.window_picker()


def key_figures(summary: dict, hits: list[dict]) -> None:
    # Each request once: a MultiConnector's children's lookups are inside its own.
    rate = pooled((h["external_hit_tokens"], h["prompt_tokens"]) for h in hits if not h["child"])
    rate = None if rate is None else round(100 * rate, 1)
    moved = sum(path["bytes"] for path in summary["transfers"].values())
    p50 = summary["ttft_ms_p50"]
    columns = st.columns(6)
    columns[0].metric("Requests", charts.request_total(summary))
    columns[1].metric("External hit rate", "–" if rate is None else f"{rate:g} %")
    columns[2].metric("Bytes moved", human_bytes(moved))
    columns[3].metric("Active leases", summary["leases_active"])
    columns[4].metric("Failure incidents", sum(summary["failures"].values()))
    columns[5].metric("TTFT p50", "–" if p50 is None else f"{p50:.1f} ms")


def span_stream_warnings(streams: list[dict]) -> None:
    for warning in charts.stream_warnings(streams):
        st.warning(warning, icon=":material/warning:")


def hit_rates(hits: list[dict]) -> None:
    st.subheader("External hit rate by connector")
    if not hits:
        ui.no_data("No lookups in this window.")
        return
    st.dataframe(charts.hit_rate_frame(hits), hide_index=True)


def paths(summary: dict) -> None:
    st.subheader("Bytes and throughput per path")
    st.dataframe(charts.paths_frame(summary), hide_index=True)


def over_time(series: dict) -> None:
    """The series operators look at first, two per row; an empty one says so."""
    st.subheader("Over time")
    found = list(series_charts.charts(series).items())
    for row in range(0, len(found), 2):
        for column, (title, chart) in zip(st.columns(2), found[row : row + 2], strict=False):
            with column:
                st.markdown(f"**{title}**")
                if chart is None:
                    st.caption("Nothing in this window.")
                else:
                    ui.chart(chart)


def engines(version: int) -> None:
    st.subheader("Engines")
    found = client.engines(version)
    if not found:
        st.caption("No engine has reported yet.")
        return
    st.dataframe(charts.engines_frame(found), hide_index=True)


def tiers(version: int) -> None:
    """Every KV tier's health: a bypassed tier (its loads kept failing) stands out."""
    found = client.tiers(version)
    if not found:
        return
    labels = client.engine_labels(version)
    st.subheader("Tiers")
    if warning := health.bypassed_warning(found, labels):
        st.error(warning, icon=":material/block:")
    table = health.tiers_frame(found, labels, time.time_ns())
    st.dataframe(health.highlight_bypassed(table), hide_index=True)


def clocks(version: int) -> None:
    """Hosts' clocks against the backend's; a spread past the threshold is said out loud."""
    found = client.clocks(version)
    if not found or not found["processes"]:
        return
    if found["mixed"]:
        st.warning(
            f"Reporting processes' clocks differ by about {found['spread_ms']:.0f} ms "
            f"(over {found['threshold_ms']:g} ms): timelines that join them may misorder events.",
            icon=":material/schedule:",
        )
    with st.expander("Clocks: offset of each process against the backend"):
        st.caption(
            "Estimated as -min(received - span end) over the newest spans: the true offset is "
            "this plus the smallest export delay, so it is never less than shown."
        )
        st.dataframe(health.clocks_frame(found, client.engine_labels(version)), hide_index=True)


def silent_recomputes(version: int) -> None:
    """Loads that failed while users still got an answer: counted, costed and linked."""
    found = client.recomputes(version, window_s)
    if found is None:
        return
    st.subheader("Silent recomputes")
    sentence = recompute_charts.headline(found)
    if sentence is None:
        st.caption("No request needed a failed KV load recomputed in this window.")
        return
    st.warning(sentence, icon=":material/replay:")
    st.markdown(recompute_charts.recomputes_table(found, client.engine_labels(version)))


def token_accounting(version: int) -> None:
    """Prompt tokens by source per engine, and every request whose tokens do not add up."""
    found = client.accounting(version, window_s)
    if found is None or not found["engines"]:
        return
    st.subheader("Token accounting")
    st.caption(f"Hit rate: {found['definition']}.")
    labels = client.engine_labels(version)
    st.markdown(accounting_charts.engines_table(found, labels))
    sentence = accounting_charts.headline(found)
    if sentence is None:
        st.caption("Every request's tokens add up.")
        return
    st.error(sentence, icon=":material/calculate:")
    st.markdown(accounting_charts.violations_table(found, labels))


def miss_reasons(version: int) -> None:
    """Why prompt tokens missed the tiers, per engine; a host tier's alarm said in words."""
    labels = client.engine_labels(version)
    for sentence in misses_charts.alarm_sentences(client.tier_alarms(version, max(window_s, 600))):
        st.error(sentence, icon=":material/delete_sweep:")
    found = client.misses(version, window_s)
    if found is None or not found["engines"]:
        return
    st.subheader("Why tokens missed")
    if headline := misses_charts.headline(found, labels):
        st.warning(headline, icon=":material/search_off:")
    st.markdown(misses_charts.engines_table(found, labels))


@ui.live
def overview(version: int) -> None:
    summary = client.summary(version, window_s)
    hits = client.hit_rates(version, window_s)
    span_stream_warnings(client.streams(version))
    if summary["spans"] == 0:
        ui.no_data(
            "No spans arrived in this window: start an engine with tracing on "
            "(OTEL_EXPORTER_OTLP_ENDPOINT at the backend), or pick a longer window."
        )
    key_figures(summary, hits)
    tiers(version)
    silent_recomputes(version)
    token_accounting(version)
    miss_reasons(version)
    transport_sections.transport_warnings(version, window_s)
    over_time(client.series(version, window_s))
    left, right = st.columns(2)
    with left:
        hit_rates(hits)
        paths(summary)
    with right:
        engines(version)
        clocks(version)
