"""Leases: who holds which host blocks, oldest first against their timeout, and how ended
leases ended."""

import time

import streamlit as st

from kvscope.dashboard import client, ui
from kvscope.dashboard.charts import leases as lease_charts
from kvscope.dashboard.charts import tables

st.title("Leases")
st.caption(
    "A lease pins host blocks from the lookup that found them until their load completes. "
    "Held leases are listed oldest first (the leaked ones are the old ones); expired and "
    "overdue leases are red. An engine that stopped reporting has its leases ended as "
    "'engine_lost'."
)


def lease_figures(held: dict, ended: dict) -> None:
    states = [tables.lease_state(lease) for lease in held["items"] + ended["items"]]
    columns = st.columns(4)
    columns[0].metric("Held", held["total"])
    columns[1].metric("Overdue", states.count("overdue"))
    columns[2].metric("Expired (recent)", states.count("expired"))
    columns[3].metric("Ended (all)", ended["total"])


def lease_ages(held: list[dict], now_ns: int) -> None:
    st.subheader("Age of held leases against their timeout")
    frame = lease_charts.lease_age_frame(held, now_ns)
    if frame.empty:
        st.caption("No lease is held right now.")
        return
    ui.chart(lease_charts.lease_age_chart(frame))


def lease_table(title: str, leases: list[dict], empty: str, labels: dict[str, str]) -> None:
    st.subheader(title)
    if not leases:
        st.caption(empty)
        return
    table = tables.leases_table(leases, time.time_ns(), labels)
    st.dataframe(tables.highlight_expired(table), hide_index=True)


@ui.live
def lease_page(version: int) -> None:
    held = client.leases(version, active=True)
    ended = client.leases(version, active=False, limit=200)
    ui.certainty_warning(held["certainty"])
    if not held["total"] and not ended["total"]:
        ui.no_data("Leases appear when a lookup finds blocks in the host pool.")
        return
    labels = client.engine_labels(version)
    lease_figures(held, ended)
    lease_ages(held["items"], time.time_ns())
    lease_table("Held now, oldest first", held["items"], "No lease is held right now.", labels)
    lease_table("Ended, newest first", ended["items"], "No lease has ended yet.", labels)
