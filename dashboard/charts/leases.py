"""Lease ages against their timeout: the held leases, oldest first, as bars (pure functions)."""

import altair as alt
import pandas as pd

MAX_BARS = 200


def lease_age_frame(held: list[dict], now_ns: int) -> pd.DataFrame:
    """One row per held lease (the oldest MAX_BARS): its age and its timeout, in seconds."""
    rows = [
        {
            "lease": f"{lease['lease_id']} · {lease['holder'] or '?'}",
            "age s": round((now_ns - lease["acquired_ns"]) / 1e9, 3),
            "timeout s": lease["timeout_s"],
            "state": "overdue" if lease["overdue"] else "held",
        }
        for lease in held[:MAX_BARS]
        if lease["acquired_ns"] is not None
    ]
    return pd.DataFrame(rows, columns=["lease", "age s", "timeout s", "state"])


def lease_age_chart(frame: pd.DataFrame) -> alt.Chart:
    """Bars of age, oldest on top; a tick at each lease's timeout shows how close it is."""
    order = alt.SortField("age s", order="descending")
    base = alt.Chart(frame).encode(y=alt.Y("lease:N", sort=order, title=None))
    bars = base.mark_bar().encode(
        x=alt.X("age s:Q", title="age (s)"),
        color=alt.Color(
            "state:N", scale=alt.Scale(domain=["held", "overdue"], range=["#4c78a8", "#e45756"])
        ),
        tooltip=["lease:N", "age s:Q", "timeout s:Q", "state:N"],
    )
    ticks = base.mark_tick(color="black", thickness=2).encode(x="timeout s:Q")
    return (bars + ticks).properties(height=max(120, 18 * len(frame)))
