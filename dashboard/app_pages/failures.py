"""Failures: a live feed of failure incidents (one per fault), each with its chain."""

import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import tables
from kvscope.dashboard.charts.format import clock, engine_name

KINDS = {
    "all": None,
    "load failed": "load_failed",
    "lease expired": "lease_expired",
    "transfer failed": "transfer_failed",
}

LATEST = 8

st.title("Failures")
st.caption(
    "Newest first, one row per incident: what failed and why, the policy vLLM applied, what "
    "became of the request, and which child served a fallback. The reports of one fault "
    "(failed transfer, the connector's load failure, the MultiConnector's decision, vLLM's "
    "blocks to recompute) are folded into it."
)
kind = KINDS[st.segmented_control("Kind", list(KINDS), default="all", key="kind") or "all"]


def latest(incidents: list[dict], labels: dict[str, str]) -> None:
    """The newest incidents as sentences: when, what, its chain, whom it hit, where."""
    for incident in incidents:
        st.markdown(
            f"**{clock(incident['time_ns'])}** · {incident['kind'].replace('_', ' ')} · "
            f"{tables.chain_text(incident)} · request `{incident['request_id'] or 'unknown'}` "
            f"on {engine_name(incident['engine_id'], labels)} · {incident['reports']} reports"
        )


@ui.live
def failure_feed(version: int) -> None:
    found = client.incidents(version, limit=500, kind=kind)
    if not found["total"]:
        ui.no_data("No failures recorded. They appear here as soon as the backend has them.")
        return
    labels = client.engine_labels(version)
    columns = st.columns(2)
    columns[0].metric("Incidents", found["total"])
    columns[1].metric("Reports folded in", found["reports"])
    if found["truncated"]:
        st.warning("More reports than one page folds: the oldest incidents are left out.")
    latest(found["items"][:LATEST], labels)
    table = tables.incidents_table(found["items"], labels)
    st.dataframe(
        table, hide_index=True, column_config={"detail": st.column_config.TextColumn(width="large")}
    )
