"""Overview: requests, hit rates, bytes per path, leases and failures over a window."""

import time

import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import overview as charts
from kvscope.dashboard.charts.format import human_bytes, percent

st.title("Overview")
window_s = ui.window_picker()


def key_figures(summary: dict, hits: list[dict]) -> None:
    hit_tokens = sum(hit["external_hit_tokens"] for hit in hits)
    prompt_tokens = sum(hit["prompt_tokens"] for hit in hits)
    moved = sum(path["bytes"] for path in summary["transfers"].values())
    rate = percent(hit_tokens, prompt_tokens)
    p50 = summary["ttft_ms_p50"]
    columns = st.columns(6)
    columns[0].metric("Requests", charts.request_total(summary))
    columns[1].metric("External hit rate", "–" if rate is None else f"{rate:g} %")
    columns[2].metric("Bytes moved", human_bytes(moved))
    columns[3].metric("Active leases", summary["leases_active"])
    columns[4].metric("Failures", sum(summary["failures"].values()))
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


def failures_per_minute(version: int) -> None:
    st.subheader("Failures per minute by cause")
    since_ns = time.time_ns() - int(window_s * 1e9)
    found = client.failures(version, since_ns=since_ns, limit=1000)["items"]
    per_minute = charts.failures_per_minute(found, since_ns)
    if per_minute.empty:
        st.success("No failures in this window.", icon=":material/check_circle:")
        return
    ui.chart(charts.failures_chart(per_minute))


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
    left, right = st.columns(2)
    with left:
        hit_rates(hits)
        paths(summary)
    with right:
        failures_per_minute(version)
