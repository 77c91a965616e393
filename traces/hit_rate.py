"""The one hit-rate definition: hit tokens over prompt tokens, both summed over the window."""

from collections.abc import Iterable

DEFINITION = "hit tokens / prompt tokens, each summed over the window (never a mean of ratios)"
"""What every hit rate kvscope shows means (API, dashboard, /metrics, Grafana)."""

PROMQL = (
    "sum by (engine_id) (rate(kvscope_backend_hit_tokens_total[$__rate_interval])) / "
    "clamp_min(sum by (engine_id) (rate(kvscope_backend_prompt_tokens_total"
    "[$__rate_interval])), 1)"
)
"""The same rate over the backend's counters, as the Grafana dashboard plots it (all sources;
add {source="host"} or another source to the numerator for one tier)."""


def hit_rate(hit_tokens: float, prompt_tokens: float) -> float | None:
    """Hit tokens over prompt tokens, as a fraction; None when there was no prompt token."""
    return hit_tokens / prompt_tokens if prompt_tokens > 0 else None


def pooled(pairs: Iterable[tuple[float, float]]) -> float | None:
    """The hit rate of many (hit tokens, prompt tokens) pairs: totals first, then the ratio."""
    hits = prompts = 0.0
    for hit, prompt in pairs:
        hits += hit
        prompts += prompt
    return hit_rate(hits, prompts)
