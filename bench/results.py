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
