"""The convoy bench's table and figures: each offload arm over recompute, per burst size."""

import os
import statistics

from kvscope.bench.common.results import record

LOAD_EACH = "offload_load_each"
"""The arm with share_loads off: every request of a burst loads the prefix itself."""
TTFT_P50_TARGET_N = 16
"""The burst size whose TTFT p50 has the 2x goal (at least 2x better than recompute)."""


def percentile(values: list[float], share: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default)."""
    ordered = sorted(values)
    rank = share * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def report(results: dict, shape: str, prefix_tokens: int) -> None:
    """Prints the table; records the offload arm's ratios with their targets and the load-each
    arm's beside them (what one shared load changes)."""
    load = os.getloadavg()[0]
    print(
        "\n| N | arm | TTFT p50 / p99 (ms) | tokens/s | TTFT p50 over recompute "
        "| TTFT p99 over recompute | tokens/s over recompute |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for n, recompute in results["recompute"].items():
        base = _figures(recompute)
        print(f"| {n} | recompute | {base[0]:.1f} / {base[1]:.1f} | {base[2]:.1f} | | | |")
        for arm in ("offload", LOAD_EACH):
            times = results[arm][n]
            p50, p99, rate = _figures(times)
            ratios = (p50 / base[0], p99 / base[1], rate / base[2])
            print(
                f"| {n} | {arm} | {p50:.1f} / {p99:.1f} | {rate:.1f} | {ratios[0]:.3f} "
                f"| {ratios[1]:.3f} | {ratios[2]:.3f} |"
            )
            run = (
                f"; {shape} model, {prefix_tokens}-token prefix, {len(times.ttfts_s)} requests "
                f"in {len(times.walls_s)} bursts an arm; 1-min load at the end {load:.1f}"
            )
            p50_note = f"{p50:.1f} vs {base[0]:.1f} ms p50{run}"
            rate_note = f"{rate:.1f} vs {base[2]:.1f} output tokens/s{run}"
            if arm == LOAD_EACH:
                _record(f"ttft_p50_load_each_over_recompute_n{n}", ratios[0], "", p50_note)
                _record(f"tokens_per_s_load_each_over_recompute_n{n}", ratios[2], "", rate_note)
                continue
            p50_target = "<= 0.5" if n == TTFT_P50_TARGET_N else "<= 1.0"
            p99_note = f"{p99:.1f} vs {base[1]:.1f} ms p99{run}"
            _record(f"ttft_p50_over_recompute_n{n}", ratios[0], p50_target, p50_note)
            _record(f"ttft_p99_over_recompute_n{n}", ratios[1], "<= 1.0", p99_note)
            _record(f"tokens_per_s_over_recompute_n{n}", ratios[2], ">= 1.0", rate_note)


def _figures(times) -> tuple[float, float, float]:
    """TTFT p50 and p99 in ms, output tokens a second."""
    ttfts = times.ttfts_s
    return statistics.median(ttfts) * 1000, percentile(ttfts, 0.99) * 1000, times.tokens_per_s


def _record(metric: str, value: float, target: str, note: str) -> None:
    record("convoy_bursts", metric, value, "ratio", target, note)
