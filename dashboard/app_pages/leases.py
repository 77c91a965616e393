"""Leases: who holds which host blocks, for how long, and how ended leases ended."""

import time

import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import tables

st.title("Leases")
st.caption(
    "A lease pins host blocks from the lookup that found them until their load completes. "
    "Expired and overdue leases are red."
)


def lease_figures(held: dict, ended: dict) -> None:
    states = [tables.lease_state(lease) for lease in held["items"] + ended["items"]]
    columns = st.columns(4)
    columns[0].metric("Held", held["total"])
    columns[1].metric("Overdue", states.count("overdue"))
    columns[2].metric("Expired (recent)", states.count("expired"))
    columns[3].metric("Ended (all)", ended["total"])


def lease_table(title: str, leases: list[dict], empty: str) -> None:
    st.subheader(title)
    if not leases:
        st.caption(empty)
        return
    table = tables.leases_table(leases, time.time_ns())
    st.dataframe(tables.highlight_expired(table), hide_index=True)


@ui.live
def lease_page(version: int) -> None:
    held = client.leases(version, active=True)
    ended = client.leases(version, active=False, limit=200)
    ui.certainty_warning(held["certainty"])
    if not held["total"] and not ended["total"]:
        ui.no_data("Leases appear when a lookup finds blocks in the host pool.")
        return
    lease_figures(held, ended)
    lease_table("Held now", held["items"], "No lease is held right now.")
    lease_table("Ended, newest first", ended["items"], "No lease has ended yet.")
