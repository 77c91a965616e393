"""One row of the report's table (Figure) and how a target such as ">= 0.9" is read."""

import math
import operator
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One row of the report's table."""

    bench: str
    metric: str
    unit: str
    target: str  # ">= 0.9", "<= 50", "== 0"; "" for a figure shown without a verdict
    label: str  # what the figure is, in words
    sizes: str = "any"
    """"quick" or "full" for a figure only runs of that size record (a bench's quick run uses
    another model or fewer lengths); such a row is left out of the other size's report."""


_TARGET = re.compile(r"^\s*(>=|<=|==|>|<)\s*([-+]?[0-9][0-9_,]*(?:\.[0-9]*)?(?:[eE][-+]?\d+)?)")
_COMPARE = {
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    ">": operator.gt,
    "<": operator.lt,
}


def target_bound(target: str) -> float | None:
    """The number in a target such as ">= 0.9"; None when the target has none."""
    match = _TARGET.match(target or "")
    return float(match.group(2).replace(",", "").replace("_", "")) if match else None


def target_met(value: float, target: str) -> bool | None:
    """Whether value meets a target such as ">= 0.9"; None when the target says nothing."""
    bound = target_bound(target)
    if bound is None:
        return None
    if math.isnan(value):
        return False
    return _COMPARE[_TARGET.match(target).group(1)](value, bound)
