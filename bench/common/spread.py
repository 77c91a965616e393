"""Median and spread of timed samples, and bootstrap intervals for a median and for a ratio of
two medians."""

import random
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """Median, quartiles and extremes of some samples (NaN when there are none)."""

    median: float
    q1: float
    q3: float
    low: float
    high: float
    count: int

    @classmethod
    def of(cls, samples: list[float]) -> "Spread":
        values = sorted(v for v in samples if v == v)  # NaN (no first token) drops out
        if not values:
            nan = float("nan")
            return cls(nan, nan, nan, nan, nan, 0)
        q1, _, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        return cls(statistics.median(values), q1, q3, values[0], values[-1], len(values))

    def text(self, scale: float = 1.0, unit: str = "") -> str:
        """'0.123 (IQR 0.100-0.150, 0.090-0.400, n=15)' in the given unit."""
        s = scale
        return (
            f"{self.median * s:.3f}{unit} (IQR {self.q1 * s:.3f}-{self.q3 * s:.3f},"
            f" range {self.low * s:.3f}-{self.high * s:.3f}, n={self.count})"
        )


def median_ratio_interval(
    mine: list[float], theirs: list[float], share: float = 0.9, resamples: int = 2000
) -> tuple[float, float]:
    """A bootstrap interval holding `share` of resampled median(mine)/median(theirs).

    Seeded, so the same samples always give the same interval."""
    mine = [v for v in mine if v == v]
    theirs = [v for v in theirs if v == v]
    if not mine or not theirs:
        return float("nan"), float("nan")
    draw = random.Random(0)
    ratios = (
        statistics.median(draw.choices(mine, k=len(mine)))
        / statistics.median(draw.choices(theirs, k=len(theirs)))
        for _ in range(resamples)
    )
    return _central(ratios, share)


def median_interval(
    samples: list[float], share: float = 0.9, resamples: int = 2000
) -> tuple[float, float]:
    """A bootstrap interval holding `share` of resampled medians of samples (paired per-round
    ratios, say). Seeded, so the same samples always give the same interval."""
    values = [v for v in samples if v == v]
    if not values:
        return float("nan"), float("nan")
    draw = random.Random(0)
    medians = (statistics.median(draw.choices(values, k=len(values))) for _ in range(resamples))
    return _central(medians, share)


def _central(resampled, share: float) -> tuple[float, float]:
    """The bounds that hold the central `share` of the resampled statistics."""
    ordered = sorted(resampled)
    tail = (1 - share) / 2
    low = ordered[int(tail * len(ordered))]
    return low, ordered[min(int((1 - tail) * len(ordered)), len(ordered) - 1)]
