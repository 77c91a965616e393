"""Sizing: what each engine's host pool would hit at other sizes and policies, from its traffic."""

import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import sizing
from kvscope.dashboard.charts.format import engine_name
from kvscope.dashboard.client import CACHE_TTL_S

WINDOWS = {"15 min": 900, "1 hour": 3600, "6 hours": 21600, "24 hours": 86400}

st.title("Sizing")
st.caption(
    "Each engine's recorded host-pool lookups and stores, replayed against a pool of a quarter "
    "to eight times today's size under the pool's own LRU and under scan-resistant 2Q. Time "
    "saved prices the hits with this engine's measured load rate and prefill rate."
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
        frame = sizing.sizing_frame(engine)
        left, right = st.columns(2)
        with left:
            st.markdown("**Hit rate against pool size**")
            ui.chart(sizing.against_size(frame, "pool hit rate %"))
        with right:
            st.markdown("**Time saved against pool size**")
            if frame["seconds saved"].notna().any():
                ui.chart(sizing.against_size(frame, "seconds saved"))
            else:
                st.info("No load or prefill timing in this window to price the hits with.")
        st.dataframe(frame.drop(columns=["factor"]), hide_index=True)
