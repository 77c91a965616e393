"""Expected figures of the convoy bench: bursts sharing one prefix, offload over recompute."""

from kvscope.bench.report.figures.figure import Figure

BURSTS = (1, 4, 16)
"""The burst sizes of the bench's documented run (the mid model, a 2k-token prefix)."""


def _burst_figures(n: int) -> list[Figure]:
    p50_target = "<= 0.5" if n == 16 else "<= 1.0"
    burst = f"a burst of {n} sharing a 2k-token prefix, mid model"
    return [
        Figure(
            "convoy_bursts",
            f"ttft_p50_over_recompute_n{n}",
            "ratio",
            p50_target,
            f"TTFT p50 from the offload pool over recompute, {burst}",
        ),
        Figure(
            "convoy_bursts",
            f"ttft_p99_over_recompute_n{n}",
            "ratio",
            "<= 1.0",
            f"TTFT p99 from the offload pool over recompute, {burst}",
        ),
        Figure(
            "convoy_bursts",
            f"tokens_per_s_over_recompute_n{n}",
            "ratio",
            ">= 1.0",
            f"output tokens/s with the offload pool over recompute, {burst}",
        ),
        Figure(
            "convoy_bursts",
            f"ttft_p50_load_each_over_recompute_n{n}",
            "ratio",
            "",
            f"the same TTFT p50 with a load a request (share_loads off: the convoy), {burst}",
        ),
        Figure(
            "convoy_bursts",
            f"tokens_per_s_load_each_over_recompute_n{n}",
            "ratio",
            "",
            f"the same tokens/s with a load a request (share_loads off: the convoy), {burst}",
        ),
    ]


CONVOY_FIGURES: list[Figure] = [figure for n in BURSTS for figure in _burst_figures(n)]
"""Per burst size: the offload arm's three ratios with targets, the load-each arm's two."""
