"""Machine-readable bench figures: each bench records its ratios here for `bench/report`."""

import json
import os
import platform
import time
from pathlib import Path

RESULTS_ENV = "KVSCOPE_BENCH_RESULTS"
"""When set, a path: every recorded figure is appended to it as one JSON line."""


def record(
    bench: str, metric: str, value: float, unit: str = "ratio", target: str = "", note: str = ""
) -> None:
    """Appends one figure (a ratio, a rate, a latency) to the results file, if one is set.

    `target` is the goal as text (">= 0.98", "<= 50 ms"); the report shows it beside the value.
    Printing stays each bench's own job; this only makes the figure readable by the report.
    """
    path = os.environ.get(RESULTS_ENV)
    if not path:
        return
    row = {
        "bench": bench,
        "metric": metric,
        "value": float(value),
        "unit": unit,
        "target": target,
        "note": note,
        "time": time.time(),
        "host": platform.node(),
    }
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


def load(path: Path) -> list[dict]:
    """Every figure recorded in one results file, in order."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


HEADLINE_TOKENS = 2048
"""The prefix length a shape's headline figure is measured at (the `_mid` figures)."""


def length_metric(base: str, shape: str, tokens: int, lengths: int = 1) -> str:
    """A per-prefix-length figure's name: `<base>_mid` for the mid shape at 2k tokens,
    `<base>_1k`, `<base>_4k`... for its other lengths; on another shape `<base>` when the run
    has one length, else `<base>_<shape>_<n>k`."""
    size = f"{tokens // 1024}k" if tokens % 1024 == 0 else str(tokens)
    if shape == "mid":
        return f"{base}_mid" if tokens == HEADLINE_TOKENS else f"{base}_{size}"
    return base if lengths == 1 else f"{base}_{shape}_{size}"
