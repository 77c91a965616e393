"""Sizing: what each engine's host pool would hit at other sizes and policies, from its traffic."""

import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import sizing, sizing_curves
from kvscope.dashboard.charts.format import engine_name
from kvscope.dashboard.client import CACHE_TTL_S

WINDOWS = {"15 min": 900, "1 hour": 3600, "6 hours": 21600, "24 hours": 86400}

st.title("Sizing")
st.caption(
    "Each engine's recorded host-pool lookups and stores, replayed against a pool of a quarter "
    "to eight times today's size under the pool's own LRU and under scan-resistant 2Q and "
    "S3-FIFO; the ceiling is a pool that never evicts, the knee the smallest pool within 1% of "
    "it. A lookup that finds a block still being stored misses, as in the pool. Time saved and "
    "predicted TTFT price each request's hits with this engine's measured load and prefill rates."
)
window = WINDOWS[st.segmented_control("Window", list(WINDOWS), default="1 hour") or "1 hour"]


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=16)
def plan_report(version: int, window_s: float) -> dict:
    return client.get("/api/v1/plan", window=window_s)


@ui.live
def sizing_section(version: int) -> None:
    report = plan_report(version, window)
    labels = client.engine_labels(version)
    for engine_id in report["not_replayable"]:
        st.warning(
            f"{engine_name(engine_id, labels)}: its lookups did not record the blocks they asked "
            "(spans from before kvscope.block.looked_up), so its pool cannot be replayed."
        )
    if not report["engines"]:
        ui.no_data("No host pool lookups in this window. They appear once an engine runs.")
        return
    for engine in report["engines"]:
        st.subheader(engine_name(engine["engine_id"], labels))
        st.markdown(sizing.headline(engine))
        st.markdown(sizing.ceiling_sentence(engine))
        st.markdown(sizing.knee_sentence(engine))
        curve = sizing.curve_frame(engine)
        left, right = st.columns(2)
        with left:
            st.markdown("**Hit rate against pool size**")
            ui.chart(sizing_curves.hit_rate_chart(curve, engine["ceiling"]))
        with right:
            st.markdown("**Predicted TTFT against pool size**")
            if curve["predicted TTFT p50 ms"].notna().any():
                ui.chart(sizing_curves.ttft_chart(curve, engine["measured_ttft_ms_p50"]))
            else:
                st.info(
                    "No measured TTFT (vLLM's llm_request spans) or no load and prefill timing "
                    "in this window to predict TTFT with."
                )
        st.dataframe(sizing.sizing_frame(engine).drop(columns=["factor"]), hide_index=True)
