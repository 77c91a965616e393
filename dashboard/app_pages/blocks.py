"""Blocks: a live map of every block slot by engine, tier and state; one block's history."""

import time

import pandas as pd
import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import blocks as charts
from kvscope.dashboard.charts import tables
from kvscope.dashboard.charts.format import clock

st.title("Blocks")
st.caption(
    "One cell per block slot, at its block id. A leased host block is pinned until its load "
    "to the engine completes. With several KV cache groups (vLLM's hybrid KV cache manager) "
    "block ids are addresses within a group: each group has its own map. "
    "Click a cell to see its history and holders."
)


def block_maps(frame) -> None:
    st.dataframe(charts.state_counts(frame), hide_index=True)
    for panel, cells in frame.groupby("panel", sort=False):
        st.markdown(f"**{panel}** · {len(cells)} blocks")
        event = ui.chart(
            charts.block_map(cells),
            stretch=False,
            height=charts.map_height(cells),
            on_select="rerun",
            selection_mode="block",
            key=panel,
        )
        picked = event.selection.get("block") if event else None
        if picked:
            st.session_state["block_panel"] = panel
            st.session_state["block_address"] = picked[0]["address"]


def picked_block(frame):
    """The block chosen by a click on a map or with the pickers below."""
    panels = list(frame["panel"].unique())
    _keep_if_in("block_panel", panels)
    left, right = st.columns(2)
    panel = left.selectbox("Engine · tier", panels, key="block_panel")
    in_panel = frame[frame["panel"] == panel]
    addresses = list(in_panel["address"])
    _keep_if_in("block_address", addresses)
    address = right.selectbox("Block", addresses, key="block_address")
    return in_panel[in_panel["address"] == address].iloc[0]


def _keep_if_in(key: str, options: list) -> None:
    """A remembered choice that is no longer offered (the block changed) is dropped."""
    if key in st.session_state and st.session_state[key] not in options:
        del st.session_state[key]


def _text(value, empty: str = "–") -> str:
    return empty if value is None or pd.isna(value) else str(value)


def only_groups(frame):
    """The blocks of the KV cache groups picked; no picker while there is one group."""
    groups = charts.groups_of(frame)
    if len(groups) < 2:
        return frame
    picked = st.multiselect(
        "KV cache groups", groups, default=groups, format_func=lambda g: f"group {g}"
    )
    return frame[frame["kv_group"].isin(picked)]


def block_details(version: int, block) -> None:
    st.subheader(f"Block {block['address']} · {block['state']}")
    st.write(
        f"KV cache group {int(block['kv_group'])} · hash `{_text(block['block_hash'])}` · "
        f"last change {clock(int(block['updated_ns']))} "
        f"by request `{_text(block['request_id'])}` · lease `{_text(block['lease_id'], 'none')}`"
    )
    if pd.isna(block["block_id"]):
        return
    history = client.block_history(
        version, block["engine_id"], block["tier"], int(block["block_id"])
    )
    if "leases" in history:
        st.markdown("**Holders: leases that pinned this host block, newest first**")
        found = tables.leases_table(history["leases"], time.time_ns())
        st.dataframe(tables.highlight_expired(found), hide_index=True)
    if "failures" in history:
        st.markdown("**Load failures that named this block**")
        st.dataframe(tables.failures_table(history["failures"]), hide_index=True)


@ui.live
def block_page(version: int) -> None:
    found = client.blocks(version)
    failures = client.failures(version, kind="load_failed", limit=1000)["items"]
    frame = charts.block_frame(found["items"], failures, client.engine_labels(version))
    ui.certainty_warning(found["certainty"])
    if frame.empty:
        ui.no_data("Blocks appear when a connector stores, loads or evicts them.")
        return
    if found["total"] > len(found["items"]):
        st.warning(f"Showing {len(found['items'])} of {found['total']} blocks.")
    frame = only_groups(frame)
    if frame.empty:
        st.info("No blocks in the KV cache groups picked.")
        return
    block_maps(frame)
    block_details(version, picked_block(frame))
