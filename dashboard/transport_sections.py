"""The P2P transport truth on the Requests page (a request's TTFT split and its reads' paths)
and on the overview (a warning in words for staged, slow or impossible reads)."""

import httpx
import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import transport as charts

CACHE_TTL_S = client.CACHE_TTL_S


def _missing_is_none(path: str, **params):
    """A backend without the route (404) shows nothing rather than an error."""
    try:
        return client.get(path, **params)
    except httpx.HTTPStatusError as error:
        if error.response.status_code == 404:
            return None
        raise


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def _request_reads(version: int, request_id: str) -> list[dict]:
    return _missing_is_none("/api/v1/transport/reads", request_id=request_id) or []


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=256)
def _split(version: int, request_key: int) -> dict | None:
    return _missing_is_none(f"/api/v1/transport/requests/{request_key}/split")


@st.cache_data(ttl=CACHE_TTL_S, show_spinner=False, max_entries=64)
def _summary(version: int, window_s: float) -> dict | None:
    return _missing_is_none("/api/v1/transport/summary", window_s=window_s)


def request_transport(version: int, request: dict) -> None:
    """A P/D request's TTFT split and each of its P2P reads' path; nothing if it read none."""
    reads = _request_reads(version, request["request_id"]) if request["request_id"] else []
    if not reads:
        return
    st.markdown("**P2P transport**")
    split = _split(version, request["id"])
    if split is not None:
        st.write(charts.split_sentence(split))
        parts = charts.split_frame(split)
        if split.get("ttft_ms") is not None and not parts.empty:
            ui.chart(charts.split_chart(parts))
    for read in reads:
        for flag in read["flags"]:
            st.warning(
                f"Read of {read['bytes']:,} bytes: {charts.FLAG_WORDS.get(flag, flag)} "
                f"({read['gbps']:.3g} GB/s over {', '.join(read['ucx_lanes']) or 'unknown'})",
                icon=":material/speed:",
            )
    st.dataframe(charts.reads_frame(reads), hide_index=True)


def transport_warnings(version: int, window_s: float) -> None:
    """The window's P2P reads that went over TCP, ran under 1 GB/s or beat the line rate."""
    found = _summary(version, window_s)
    for sentence in (found or {}).get("warnings", []):
        st.warning(sentence, icon=":material/speed:")
