"""Tier health and clock tables for the overview: pure builders over the backend's answers."""

import pandas as pd

from kvscope.dashboard.charts.format import clock, engine_name

BYPASSED_STYLE = "background-color: #fde2e1; color: #8b0000; font-weight: 600"
PROBING_STYLE = "background-color: #fff4d6"
TIER_COLUMNS = ["engine", "tier", "state", "since", "for (s)", "reason", "failures", "probe at"]


def tiers_frame(tiers: list[dict], labels: dict[str, str] | None, now_ns: int) -> pd.DataFrame:
    """One row per engine and tier, in the backend's order (bypassed first)."""
    rows = [
        {
            "engine": engine_name(tier["engine_id"], labels),
            "tier": tier["tier"],
            "state": tier["state"],
            "since": clock(tier["since_ns"]),
            "for (s)": round(max(0, now_ns - tier["since_ns"]) / 1e9, 1),
            "reason": tier["reason"] or "–",
            "failures": tier["failures"],
            "probe at": clock(tier["bypassed_until_ns"]) if tier["bypassed_until_ns"] else "–",
        }
        for tier in tiers
    ]
    return pd.DataFrame(rows, columns=TIER_COLUMNS)


def highlight_bypassed(table: pd.DataFrame):
    """A bypassed tier stands out in red, a probing one in yellow."""

    def row_style(row: pd.Series) -> list[str]:
        style = {"bypassed": BYPASSED_STYLE, "probing": PROBING_STYLE}.get(row["state"], "")
        return [style] * len(row)

    return table.style.apply(row_style, axis=1).format(precision=1, na_rep="–")


def bypassed_warning(tiers: list[dict], labels: dict[str, str] | None) -> str | None:
    bypassed = [t for t in tiers if t["state"] == "bypassed"]
    if not bypassed:
        return None
    named = ", ".join(f"{t['tier']} on {engine_name(t['engine_id'], labels)}" for t in bypassed)
    return f"Bypassed (lookups answer 0, loads recompute): {named}"


def clocks_frame(clocks: dict, labels: dict[str, str] | None) -> pd.DataFrame:
    rows = [
        {
            "engine": engine_name(p["engine_id"] or p["instance_id"], labels),
            "service": p["service_name"] or "–",
            "host": p["host"] or "–",
            "offset (ms)": p["offset_ms"],
            "spans": p["samples"],
            "trusted": "yes" if p["trusted"] else "too few spans",
        }
        for p in clocks["processes"]
    ]
    columns = ["engine", "service", "host", "offset (ms)", "spans", "trusted"]
    return pd.DataFrame(rows, columns=columns)


def engine_offsets(clocks: dict) -> dict[str, float]:
    """engine id -> its processes' largest trusted offset (each is a lower bound)."""
    offsets: dict[str, float] = {}
    for process in clocks["processes"]:
        engine = process["engine_id"]
        if engine and process["trusted"]:
            offsets[engine] = max(offsets.get(engine, process["offset_ms"]), process["offset_ms"])
    return offsets


def mixed_clocks_warning(clocks: dict, engine_ids, labels=None) -> str | None:
    """A warning when a view joins engines whose clock estimates differ beyond the threshold."""
    offsets = engine_offsets(clocks)
    known = {e: offsets[e] for e in set(engine_ids) if e in offsets}
    if len(known) < 2:
        return None
    spread = max(known.values()) - min(known.values())
    if spread <= clocks["threshold_ms"]:
        return None
    each = ", ".join(f"{engine_name(e, labels)} {o:+.0f} ms" for e, o in sorted(known.items()))
    return (
        f"Clocks differ by about {spread:.0f} ms across these engines ({each}, against the "
        "backend's clock): events of different engines may be out of order by that much."
    )
