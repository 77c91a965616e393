"""Token accounting on the overview: per engine, prompt tokens by source and the one hit rate;
requests whose tokens do not add up, each linked to its timeline on the Requests page."""

from kvscope.dashboard.charts.overview import hit_percent
from kvscope.dashboard.charts.recomputes import escaped, request_link

LINKS_SHOWN = 10
"""Violating requests listed; the headline counts them all."""


def headline(found: dict) -> str | None:
    """One sentence on the requests whose tokens did not add up; None when all did."""
    bad = found.get("violations_total", 0)
    if not bad:
        return None
    noun = "request's tokens do" if bad == 1 else "requests' tokens do"
    return (
        f"{bad} {noun} not add up: prefix-cache hits + external hits + computed tokens "
        "differ from the prompt, or from what vLLM counted cached."
    )


def engines_table(found: dict, labels: dict[str, str]) -> str:
    """A Markdown table, one row per engine: prompt tokens by source, hit rate, violations."""
    lines = [
        "| Engine | Requests | Prompt tokens | Prefix cache | External (by tier) | Computed "
        "| Hit rate | Violations |",
        "|---|--:|--:|--:|---|--:|--:|--:|",
    ]
    for row in found.get("engines", []):
        external = row["external_hit_tokens"]
        tiers = ", ".join(f"{tier} {tokens:,}" for tier, tokens in external.items()) or "0"
        hits = row["local_hit_tokens"] + sum(external.values())
        rate = hit_percent(hits, row["prompt_tokens"])
        engine = labels.get(row["engine_id"], row["engine_id"])
        lines.append(
            f"| {escaped(engine)} | {row['requests']} | {row['prompt_tokens']:,} | "
            f"{row['local_hit_tokens']:,} | {escaped(tiers)} | {row['computed_tokens']:,} | "
            f"{'–' if rate is None else f'{rate:g} %'} | {row['violations']} |"
        )
    return "\n".join(lines)


def violations_table(found: dict, labels: dict[str, str]) -> str:
    """A Markdown table of the newest violating requests, each a link to its timeline."""
    lines = ["| Request | Engine | Prompt | What does not add up |", "|---|---|--:|---|"]
    for item in found.get("violations", [])[:LINKS_SHOWN]:
        engine = labels.get(item["engine_id"], item["engine_id"])
        lines.append(
            f"| {request_link(item)} | {escaped(engine)} | {item['prompt_tokens']:,} | "
            f"{escaped(item['violation'] or '')} |"
        )
    more = found.get("violations_total", 0) - min(len(found.get("violations", [])), LINKS_SHOWN)
    if more > 0:
        lines.append(f"| and {more} more | | | |")
    return "\n".join(lines)
