"""Sizing page charts: replayed pool hit rate and time saved against host pool size, per policy."""

import altair as alt
import pandas as pd

HEIGHT = 260
POLICY_LABELS = {"lru": "LRU (the pool's own)", "2q": "2Q (scan-resistant)"}


def sizing_frame(engine: dict) -> pd.DataFrame:
    """One row per policy and size of one engine's plan."""
    rows = [
        {
            "policy": POLICY_LABELS.get(row["policy"], row["policy"]),
            "size": f"{row['factor']:g}x",
            "factor": row["factor"],
            "pool blocks": row["pool_blocks"],
            "pool hit rate %": round(100 * row["pool_hit_rate"], 2),
            "hit tokens": row["hit_tokens"],
            "prefill tokens saved": row["prefill_tokens_saved"],
            "seconds saved": row["seconds_saved"],
            "evicted blocks": row["evicted_blocks"],
        }
        for row in engine["rows"]
    ]
    return pd.DataFrame(rows)


def against_size(frame: pd.DataFrame, y: str) -> alt.Chart:
    """y against the pool's size (log scale: a quarter to eight times today's), a line a policy."""
    return (
        alt.Chart(frame.dropna(subset=[y]))
        .mark_line(point=True)
        .encode(
            x=alt.X("pool blocks:Q", scale=alt.Scale(type="log"), title="host pool blocks"),
            y=alt.Y(f"{y}:Q", title=y),
            color=alt.Color("policy:N", title=None),
            tooltip=["policy:N", "size:N", "pool blocks:Q", f"{y}:Q"],
        )
        .properties(height=HEIGHT)
    )


def headline(engine: dict) -> str:
    """What today's pool is and does, and how close its replay came."""
    today = next((r for r in engine["rows"] if r["policy"] == "lru" and r["factor"] == 1.0), None)
    measured = engine["measured_hit_tokens"]
    text = (
        f"Today: {engine['pool_blocks']:,} blocks of {engine['block_size']} tokens; "
        f"{engine['lookups']:,} lookups asked {engine['asked_tokens']:,} tokens and "
        f"{measured:,} were hit."
    )
    if today is not None:
        text += f" The replay of today's pool hits {today['hit_tokens']:,}."
    return text
