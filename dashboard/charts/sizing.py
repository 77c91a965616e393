"""Sizing page tables and sentences: each engine's replays by policy and size, its ceiling and
knees, in the words and rows the page shows."""

import pandas as pd

POLICY_LABELS = {
    "lru": "LRU (the pool's own)",
    "2q": "2Q (scan-resistant)",
    "s3fifo": "S3-FIFO (scan-resistant)",
}


def policy_label(policy: str) -> str:
    return POLICY_LABELS.get(policy, policy)


def sizing_frame(engine: dict) -> pd.DataFrame:
    """One row per policy and size of one engine's plan."""
    rows = [
        {
            "policy": policy_label(row["policy"]),
            "size": f"{row['factor']:g}x",
            "factor": row["factor"],
            "pool blocks": row["pool_blocks"],
            "pool hit rate %": round(100 * row["pool_hit_rate"], 2),
            "hit tokens": row["hit_tokens"],
            "prefill tokens saved": row["prefill_tokens_saved"],
            "seconds saved": row["seconds_saved"],
            "predicted TTFT p50 ms": row["predicted_ttft_ms_p50"],
            "predicted TTFT p95 ms": row["predicted_ttft_ms_p95"],
            "evicted blocks": row["evicted_blocks"],
            "lookups of blocks in flight": row["in_flight_lookups"],
        }
        for row in engine["rows"]
    ]
    return pd.DataFrame(rows)


def curve_frame(engine: dict) -> pd.DataFrame:
    """The points of each policy's curves against pool size: the candidate sizes and its knee
    (marked), in size order."""
    points = [
        {**_point(row), "policy": policy_label(row["policy"]), "point": "size"}
        for row in engine["rows"]
    ] + [
        {**_point(knee), "policy": policy_label(knee["policy"]), "point": "knee"}
        for knee in engine["knees"]
    ]
    frame = pd.DataFrame(points)
    frame = frame.sort_values(["policy", "pool blocks", "point"])
    return frame.drop_duplicates(["policy", "pool blocks"], keep="first").reset_index(drop=True)


def _point(served: dict) -> dict:
    return {
        "pool blocks": served["pool_blocks"],
        "pool hit rate %": round(100 * served["pool_hit_rate"], 2),
        "predicted TTFT p50 ms": served["predicted_ttft_ms_p50"],
        "predicted TTFT p95 ms": served["predicted_ttft_ms_p95"],
    }


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
    if engine["priced_requests"]:
        text += (
            f" Measured TTFT p50 {engine['measured_ttft_ms_p50']:.1f} ms, p95 "
            f"{engine['measured_ttft_ms_p95']:.1f} ms over {engine['priced_requests']:,} requests."
        )
    return text


def ceiling_sentence(engine: dict) -> str:
    ceiling = engine["ceiling"]
    return (
        f"Ceiling (a pool that never evicts): {ceiling['pool_blocks']:,} blocks hit "
        f"{ceiling['hit_tokens']:,} tokens ({100 * ceiling['pool_hit_rate']:.1f}% of those "
        f"asked). {ceiling['in_flight_lookups']:,} lookups found a block still being stored "
        f"and missed it there too ({ceiling['in_flight_tokens']:,} tokens); today's pool "
        f"recorded {engine['recorded_in_flight_lookups']:,}."
    )


def knee_sentence(engine: dict) -> str:
    """Each policy's knee, in blocks and as a multiple of today's pool."""
    step = engine["size_step_blocks"]
    knees = "; ".join(
        f"{policy_label(knee['policy'])} at {knee['pool_blocks']:,} blocks "
        f"({knee['factor']:.3g}x today's)"
        for knee in engine["knees"]
    )
    return (
        f"Knee (the smallest pool within 1% of the ceiling, to a size step of {step:,} "
        f"block{'s' if step != 1 else ''}): {knees}."
    )
