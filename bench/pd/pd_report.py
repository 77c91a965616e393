"""What a P/D bench run measured per pair and prompt length, and the figures it records."""

import statistics
from dataclasses import dataclass, field

from kvscope.bench.common.results import length_metric, record
from kvscope.bench.common.spread import Spread, median_ratio_interval
from kvscope.bench.pd.pd_phases import TimedRequest


@dataclass
class Samples:
    """Timed requests at one prompt length."""

    ttft_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    timed: list[TimedRequest] = field(default_factory=list)  # for the phase breakdown


@dataclass
class PairFigures:
    """What one P/D pair measured; `error` says why a pair has no figures. `by_tokens` holds
    the samples per prompt length (0: the short default prompts); ttft_s, total_s and timed
    are those at the headline length."""

    name: str
    headline_tokens: int = 0
    by_tokens: dict[int, Samples] = field(default_factory=dict)
    idle_cpu_pct: list[float] = field(default_factory=list)  # one per window
    load_avg: list[float] = field(default_factory=list)  # 1-min load before and after requests
    start_s: float = float("nan")
    error: str = ""

    def samples(self, tokens: int) -> Samples:
        return self.by_tokens.setdefault(tokens, Samples())

    @property
    def ttft_s(self) -> list[float]:
        return self.samples(self.headline_tokens).ttft_s

    @property
    def total_s(self) -> list[float]:
        return self.samples(self.headline_tokens).total_s

    @property
    def idle_median(self) -> float:
        return statistics.median(self.idle_cpu_pct) if self.idle_cpu_pct else float("nan")


def report(results: list[PairFigures], shape: str = "tiny") -> None:
    print(
        f"\n{'pair':<22}{'start s':>9}{'TTFT s':>9}{'TTFT IQR':>15}{'total s':>9}"
        f"{'idle CPU %':>12}{'(windows)':>22}{'load':>11}  note"
    )
    for r in results:
        ttft, total = Spread.of(r.ttft_s), Spread.of(r.total_s)
        windows = " ".join(f"{w:.1f}" for w in r.idle_cpu_pct)
        iqr = f"{ttft.q1:.3f}-{ttft.q3:.3f}"
        print(
            f"{r.name:<22}{r.start_s:>9.1f}{ttft.median:>9.3f}{iqr:>15}{total.median:>9.3f}"
            f"{r.idle_median:>12.1f}{windows:>22}{_load_text(r):>11}  {r.error}"
        )
        if r.idle_cpu_pct:
            pinned = "" if r.name.endswith("unpinned") else "_pinned"
            kind = "_".join(r.name.split()[:-1]) + pinned
            target = "< 5" if kind == "ours" else ""
            note = f"{r.name}, median of the windows {windows}"
            record("pd_latency", f"idle_cpu_{kind}_pct", r.idle_median, "% of a core", target, note)
    for r in results:
        if r.ttft_s:
            print(
                f"{r.name}: TTFT {Spread.of(r.ttft_s).text(1000, ' ms')};"
                f" total {Spread.of(r.total_s).text(1000, ' ms')}"
            )
    by_name = {r.name: r for r in results}
    _report_floor(by_name)
    _report_single(by_name, shape)
    # vLLM's default stock pair carries the target; the one with kvscope's executor setting
    # shows what that setting alone gives.
    stocks = (("stock pinned", "", "<= 0.5"), ("stock uniproc pinned", "_uniproc", ""))
    for stock_name, metric_suffix, target in stocks:
        stock = by_name.get(stock_name)
        for ours in ("ours unpinned", "ours pinned"):
            mine = by_name.get(ours)
            if stock and mine and stock.ttft_s and mine.ttft_s:
                _report_ratios(ours, mine, stock_name, stock, metric_suffix, target, shape)
            elif mine and (stock or stock_name == "stock pinned"):
                print(
                    f"{ours} / {stock_name}: no ratio, the stock pair has no figures"
                    f" ({stock.error if stock else 'not run'})"
                )


def _report_ratios(
    ours: str,
    mine: PairFigures,
    stock_name: str,
    stock: PairFigures,
    metric_suffix: str,
    target: str,
    shape: str,
) -> None:
    """Ratios of medians, each with its 90 % bootstrap interval and both pairs' load."""
    suffix = "" if ours == "ours unpinned" else "_pinned"
    loads = f"load {_load_text(mine)} vs {_load_text(stock)}"
    parts = []
    for what, theirs_s, mine_s in (
        ("ttft", stock.ttft_s, mine.ttft_s),
        ("total", stock.total_s, mine.total_s),
    ):
        ratio = _ratio(mine_s, theirs_s)
        low, high = median_ratio_interval(mine_s, theirs_s)
        interval = f"90% interval {low:.2f}-{high:.2f}"
        parts.append(f"{what.upper() if what == 'ttft' else what} {ratio:.2f} ({interval})")
        note = f"{ours}; {interval}; n={len(mine_s)}/{len(theirs_s)}; {loads}"
        metric = _metric(f"{what}{suffix}_over_stock{metric_suffix}", shape, mine.headline_tokens)
        target = target if shape == "tiny" else ""  # a goal for the connector's overheads
        record("pd_latency", metric, ratio, "ratio", target, note=note)
    print(f"{ours} / {stock_name}: {', '.join(parts)} (target {target or 'none'}; {loads})")


def _load_text(figures: PairFigures) -> str:
    return "-".join(f"{load:.1f}" for load in figures.load_avg)


def _report_floor(by_name: dict[str, PairFigures]) -> None:
    """Our idle CPU against vLLM's own (the plain pair), as a difference and a ratio."""
    plain = by_name.get("plain unpinned")
    mine = by_name.get("ours unpinned")
    if not (plain and mine and plain.idle_cpu_pct and mine.idle_cpu_pct):
        return
    above = mine.idle_median - plain.idle_median
    ratio = mine.idle_median / plain.idle_median if plain.idle_median else float("nan")
    print(
        f"idle CPU, ours unpinned - plain vLLM pair: {above:+.1f} points; ours / plain: "
        f"{ratio:.2f} (plain vLLM's floor: {plain.idle_median:.1f} %)"
    )
    record("pd_latency", "idle_cpu_ours_minus_plain_pct", above, "% of a core")
    record("pd_latency", "idle_cpu_ours_over_plain", ratio, "ratio")


def _report_single(by_name: dict[str, PairFigures], shape: str) -> None:
    """TTFT through our pair over one server alone (the plain pair's decode side), per length;
    the medians too, in ms (the report plots them against the prompt length)."""
    plain, mine = by_name.get("plain unpinned"), by_name.get("ours unpinned")
    if not (plain and mine):
        return
    lengths = [tokens for tokens in mine.by_tokens if tokens in plain.by_tokens]
    for tokens in lengths:
        ours_s, single_s = mine.by_tokens[tokens].ttft_s, plain.by_tokens[tokens].ttft_s
        if not (ours_s and single_s):
            continue
        ttft = _ratio(ours_s, single_s)
        low, high = median_ratio_interval(ours_s, single_s)
        headline = tokens == mine.headline_tokens
        target = ("<= 1.5" if shape == "tiny" else "<= 1.2") if headline else ""
        at = f" at {tokens} tokens" if tokens else ""
        print(
            f"ours unpinned / one server alone{at}: TTFT {ttft:.2f} (90% interval {low:.2f}-"
            f"{high:.2f}; target {target or 'none'}; load {_load_text(mine)} vs"
            f" {_load_text(plain)})"
        )
        note = (
            f"{shape} model, {tokens or 'short'}-token prompts; 90% interval {low:.2f}-{high:.2f}"
        )
        metric = _metric("ttft_over_single", shape, tokens, len(lengths))
        record("pd_latency", metric, ttft, "ratio", target, note=note)
        if tokens:
            for what, samples in (("pd", ours_s), ("single", single_s)):
                ms = Spread.of(samples).median * 1000
                record("pd_latency", f"ttft_{what}_{shape}_{tokens}_ms", ms, "ms")


def _metric(base: str, shape: str, tokens: int, lengths: int = 1) -> str:
    """A figure's name for this shape and prompt length (bench/results.length_metric)."""
    if not tokens:
        return base if shape == "tiny" else f"{base}_{shape}"
    return length_metric(base, shape, tokens, lengths)


def _ratio(mine: list[float], theirs: list[float]) -> float:
    return Spread.of(mine).median / Spread.of(theirs).median
