"""The block map: every block slot per engine and tier, colored by state, thousands at once."""

import json
from collections.abc import Sequence

import altair as alt
import pandas as pd

from kvscope.dashboard.charts.format import engine_name

# The backend counts a host block as loading exactly while a lease pins it, so one state.
STATE_COLORS = {
    "stored": "#4c78a8",
    "loaded": "#54a24b",
    "leased/loading": "#f58518",
    "evicted": "#bab0ac",
    "failed": "#e45756",
}
COLUMNS = 64
CELL_PX = 9
LEGEND_PX = 100  # Streamlit counts the legend and padding in the height it is given
MIN_ROWS = 4
COLUMNS_OUT = [
    "engine_id",
    "tier",
    "kv_group",
    "block_id",
    "address",
    "block_hash",
    "state",
    "lease_id",
    "request_id",
    "updated_ns",
    "certain",
]


def block_frame(
    blocks: list[dict], failures: Sequence[dict] = (), labels: dict[str, str] | None = None
) -> pd.DataFrame:
    """Blocks with the state to show: leased while a lease pins them, failed when a load
    failure named the engine block after its last update (or it never arrived)."""
    rows = [{name: block.get(name) for name in COLUMNS_OUT} for block in blocks]
    for row in rows:
        row["kv_group"] = row["kv_group"] or 0  # older backends name no group: group 0
        if row["lease_id"] is not None:
            row["state"] = "leased/loading"
    by_slot = {(r["engine_id"], r["tier"], r["kv_group"], r["block_id"]): r for r in rows}
    for failure in failures:
        # A load failure names block ids without their group: group 0's slots show it.
        for block_id in json.loads(failure.get("block_ids") or "[]"):
            key = (failure["engine_id"], "device", 0, block_id)
            slot = by_slot.get(key)
            if slot is None:
                slot = by_slot[key] = _failed_row(failure, block_id)
                rows.append(slot)
            elif slot["updated_ns"] <= failure["time_ns"]:
                slot["state"] = "failed"
    frame = pd.DataFrame(rows, columns=COLUMNS_OUT)
    return _place(frame, labels)


def _failed_row(failure: dict, block_id: int) -> dict:
    return {
        **dict.fromkeys(COLUMNS_OUT),
        "engine_id": failure["engine_id"],
        "tier": "device",
        "kv_group": 0,
        "block_id": block_id,
        "address": f"id:{block_id}",
        "state": "failed",
        "request_id": failure.get("request_id"),
        "updated_ns": failure["time_ns"],
        "certain": True,
    }


def _place(frame: pd.DataFrame, labels: dict[str, str] | None = None) -> pd.DataFrame:
    """A slot keeps its cell as its state changes: cell = block id; slots known only by
    hash go after the highest id."""
    panel_keys = ["engine_id", "tier", "kv_group"]
    frame = frame.sort_values([*panel_keys, "block_id", "address"], na_position="last")
    frame = frame.reset_index(drop=True)
    cells = []
    for _, group in frame.groupby(panel_keys, sort=False):
        next_cell = int(group["block_id"].max()) + 1 if group["block_id"].notna().any() else 0
        for block_id in group["block_id"]:
            if pd.isna(block_id):
                cells.append(next_cell)
                next_cell += 1
            else:
                cells.append(int(block_id))
    frame["cell"] = cells
    frame["col"] = frame["cell"] % COLUMNS
    frame["row"] = frame["cell"] // COLUMNS
    # With one group (no hybrid KV cache manager) the panels need not say it.
    several = frame["kv_group"].nunique() > 1
    frame["panel"] = [
        f"{engine_name(e, labels)} · {t}" + (f" · group {g}" if several else "")
        for e, t, g in zip(frame["engine_id"], frame["tier"], frame["kv_group"], strict=True)
    ]
    return frame


def groups_of(frame: pd.DataFrame) -> list[int]:
    """The KV cache groups that have blocks, in order."""
    return sorted(int(g) for g in frame["kv_group"].unique()) if not frame.empty else []


def state_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """Blocks per panel and state, every state a column, for a compact table."""
    if frame.empty:
        return pd.DataFrame(columns=["panel", *STATE_COLORS])
    counts = frame.pivot_table(index="panel", columns="state", values="cell", aggfunc="count")
    return counts.reindex(columns=list(STATE_COLORS)).fillna(0).astype(int).reset_index()


def _chart_data(panel: pd.DataFrame) -> pd.DataFrame:
    """Only what the map draws, as text: an all-empty column would reach the browser as an
    Arrow null column, which makes Vega draw nothing at all."""
    data = panel[["col", "row", "state", "address"]].copy()
    for name in ("block_id", "kv_group", "block_hash", "lease_id", "request_id"):
        data[name] = [("–" if pd.isna(value) else str(value)) for value in panel[name]]
    for name in ("block_id", "kv_group"):
        data[name] = [value.removesuffix(".0") for value in data[name]]
    return data


def map_height(panel: pd.DataFrame) -> int:
    """Pixels for a panel's map: its rows of cells plus the legend above them."""
    rows = int(panel["row"].max()) + 1 if not panel.empty else 1
    return max(rows, MIN_ROWS) * CELL_PX + LEGEND_PX


def block_map(panel: pd.DataFrame) -> alt.Chart:
    """One engine and tier as a grid of cells; a click selects a block ('block' selection)."""
    rows = int(panel["row"].max()) + 1 if not panel.empty else 1
    pick = alt.selection_point(name="block", fields=["address"], on="click", empty=False)
    # Inline values, not a DataFrame: Altair refuses frames over 5000 rows, a pool has more.
    data = alt.Data(values=_chart_data(panel).to_dict("records"))
    # Quantitative axes with fixed domains: every panel has the same cell size whatever
    # slots it has (ordinal axes gave a lone block of a small panel zero height).
    hidden = alt.Axis(labels=False, ticks=False, grid=False, domain=False, title=None)
    return (
        alt.Chart(data)
        .transform_calculate(col_end="datum.col + 1", row_end="datum.row + 1")
        .mark_rect(stroke="white", strokeWidth=0.5)
        .encode(
            x=alt.X("col:Q", axis=hidden, scale=alt.Scale(domain=[0, COLUMNS], nice=False)),
            x2="col_end:Q",
            y=alt.Y(
                "row:Q", axis=hidden, scale=alt.Scale(domain=[max(rows, MIN_ROWS), 0], nice=False)
            ),
            y2="row_end:Q",
            color=alt.Color(
                "state:N",
                scale=alt.Scale(domain=list(STATE_COLORS), range=list(STATE_COLORS.values())),
                legend=alt.Legend(orient="top", title=None),
            ),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.85)),
            tooltip=[
                "block_id:N",
                "kv_group:N",
                "state:N",
                "block_hash:N",
                "lease_id:N",
                "request_id:N",
            ],
        )
        .add_params(pick)
        .properties(width=COLUMNS * CELL_PX, height=max(rows, MIN_ROWS) * CELL_PX)
    )
