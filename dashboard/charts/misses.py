"""Why prompt tokens missed the tiers, and the host tiers' alarms: the overview's table and
sentences, and one request's reasons on the Requests page."""

import pandas as pd

from kvscope.dashboard.charts.recomputes import escaped

REASON_LABELS = {
    "local_prefix_cache": "vLLM's prefix cache",
    "partial_block": "below a whole block",
    "first_sight": "first sight",
    "prefix_diverged": "prefix diverged",
    "other_key": "another key (salt, LoRA)",
    "evicted": "evicted",
    "store_in_flight": "store in flight",
    "lease_expired": "lease expired",
    "load_failed": "load failed",
    "tier_bypassed": "tier bypassed",
    "not_offered": "not offered",
}
"""Short names of the backend's reasons (GET /api/v1/stats/misses says what each means)."""

NOT_MISSES = ("local_prefix_cache", "partial_block")
"""Reasons that no tier could have served: the headline names the others."""


def label(reason: str) -> str:
    return REASON_LABELS.get(reason, reason)


def engines_table(found: dict, labels: dict[str, str]) -> str:
    """A Markdown table, one row per engine: its missed tokens and each reason's share."""
    lines = [
        "| Engine | Requests | Missed tokens | By reason (share of missed) |",
        "|---|--:|--:|---|",
    ]
    for row in found.get("engines", []):
        shares = ", ".join(
            f"{label(reason)} {100 * share:.0f}%"
            for reason, share in sorted(row["share_by_reason"].items(), key=lambda kv: -kv[1])
        )
        engine = labels.get(row["engine_id"], row["engine_id"])
        lines.append(
            f"| {escaped(engine)} | {row['requests']} | {row['missed_tokens']:,} | "
            f"{escaped(shares) or '–'} |"
        )
    return "\n".join(lines)


def headline(found: dict, labels: dict[str, str]) -> str | None:
    """The largest reason a tier could have served, per engine, in one sentence (None when
    every missed token was vLLM's own prefix cache or below a whole block)."""
    parts = []
    for row in found.get("engines", []):
        avoidable = {r: s for r, s in row["share_by_reason"].items() if r not in NOT_MISSES}
        if not avoidable:
            continue
        reason, share = max(avoidable.items(), key=lambda kv: kv[1])
        engine = labels.get(row["engine_id"], row["engine_id"])
        parts.append(f"{engine}: {100 * share:.0f}% of missed tokens {label(reason)}")
    return "; ".join(parts) + "." if parts else None


def alarm_sentences(alarms: dict | None) -> list[str]:
    """Each raised tier alarm in words, as the backend says it."""
    if not alarms:
        return []
    return [sentence for tier in alarms.get("tiers", []) for sentence in tier["alarms"]]


def tiers_frame(alarms: dict, labels: dict[str, str]) -> pd.DataFrame:
    """One row per engine's host tier: stores, hits, evictions unread, idle and reuse times."""
    rows = []
    for tier in alarms.get("tiers", []):
        dropped = tier["dropped_before_reuse"]
        rows.append(
            {
                "Engine": labels.get(tier["engine_id"], tier["engine_id"]),
                "Tier": tier["tier"],
                "Stored blocks": tier["stored_blocks"],
                "Hit blocks": tier["hit_blocks"],
                "Evicted": tier["evicted_blocks"],
                "Evicted unread": "–" if dropped is None else f"{100 * dropped:.0f}%",
                "Idle before evict p50 (s)": tier["idle_before_evict_s"]["p50"],
                "Reuse gap p50 (s)": tier["reuse_gap_s"]["p50"],
                "Reuse distance p50 (blocks)": tier["reuse_distance_blocks"]["p50"],
            }
        )
    return pd.DataFrame(rows)


def request_table(found: dict) -> str:
    """One request's missed tokens as a Markdown table, one row per reason (and run of blocks)."""
    lines = ["| Reason | Tokens | Blocks | Detail |", "|---|--:|---|---|"]
    for item in found.get("reasons", []):
        where = ""
        if item.get("first_block") is not None:
            where = f"blocks {item['first_block']}-{item['first_block'] + item['blocks'] - 1}"
        detail = ""
        if item.get("evicted_before_lookup_s") is not None:
            detail = f"evicted {item['evicted_before_lookup_s']:.1f} s before the lookup"
        elif item.get("diverged_at_block") is not None:
            detail = f"diverged at block {item['diverged_at_block']}"
        lines.append(f"| {label(item['reason'])} | {item['tokens']:,} | {where} | {detail} |")
    return "\n".join(lines)
