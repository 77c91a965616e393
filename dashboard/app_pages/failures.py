"""Failures: a live feed of load failures, expired leases and failed transfers."""

import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import tables
from kvscope.dashboard.charts.format import clock, short_cause

KINDS = {"all": None, "load failed": "load_failed", "lease expired": "lease_expired",
         "transfer failed": "transfer_failed"}  # fmt: skip

LATEST = 8

st.title("Failures")
st.caption("Newest first: what failed, why, the policy vLLM applied, and the request it hit.")
kind = KINDS[st.segmented_control("Kind", list(KINDS), default="all", key="kind") or "all"]


def latest(failures: list[dict]) -> None:
    """The newest failures as sentences: what failed, why, what vLLM did, whom it hit."""
    for failure in failures:
        policy = failure["policy"] or "no policy"
        outcome = failure["outcome"] or "outcome not reported"
        st.markdown(
            f"**{clock(failure['time_ns'])}** · {failure['kind'].replace('_', ' ')} · "
            f"cause `{short_cause(failure['cause'])}` · {policy} → {outcome} · "
            f"request `{failure['request_id'] or 'unknown'}`"
        )


@ui.live
def failure_feed(version: int) -> None:
    found = client.failures(version, limit=500, kind=kind)
    if not found["total"]:
        ui.no_data("No failures recorded. They appear here as soon as the backend has them.")
        return
    st.metric("Failures", found["total"])
    latest(found["items"][:LATEST])
    table = tables.failures_table(found["items"])
    st.dataframe(
        table, hide_index=True, column_config={"detail": st.column_config.TextColumn(width="large")}
    )
