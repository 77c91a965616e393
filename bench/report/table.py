"""Rows of the report's figure table: each expected figure matched to what the benches recorded."""

import math
from dataclasses import dataclass

from kvscope.bench.report.figures import FIGURES, Figure, canonical, target_met
from kvscope.bench.report.runner import BenchRun


@dataclass(frozen=True)
class Row:
    """One figure as the report shows it; value is None when nothing was recorded."""

    bench: str
    metric: str
    label: str
    unit: str
    target: str
    value: float | None
    note: str
    missing_why: str  # when value is None: "not recorded", "bench failed", ...
    expected: bool  # listed in FIGURES (else recorded under a name the list lacks)

    @property
    def met(self) -> bool | None:
        return None if self.value is None else target_met(self.value, self.target)


def _missing_why(run: BenchRun | None) -> str:
    if run is None or run.status == "not run":
        return f"not run{f' ({run.reason})' if run and run.reason else ''}"
    if run.status in ("failed", "timed out"):
        return f"bench {run.status}"
    return "not recorded"


def build_rows(runs: list[BenchRun], records: list[dict], quick: bool | None = None) -> list[Row]:
    """FIGURES in order, then any recorded figure FIGURES does not list (last value wins).
    With `quick` given, a figure only the other size records is left out unless recorded."""
    latest: dict[tuple[str, str], dict] = {}
    for record in records:
        latest[(record["bench"], canonical(record["bench"], record["metric"]))] = record
    run_of = {run.name: run for run in runs}
    other_size = {None: "", True: "full", False: "quick"}[quick]
    rows = [
        _expected_row(
            figure, latest.pop((figure.bench, figure.metric), None), run_of.get(figure.bench)
        )
        for figure in FIGURES
    ]
    sized = {(f.bench, f.metric) for f in FIGURES if f.sizes == other_size}
    rows = [row for row in rows if row.value is not None or (row.bench, row.metric) not in sized]
    for (bench, metric), record in latest.items():
        rows.append(
            Row(
                bench,
                metric,
                metric,
                record.get("unit", ""),
                record.get("target", ""),
                float(record["value"]),
                record.get("note", ""),
                "",
                expected=False,
            )
        )
    return rows


def _expected_row(figure: Figure, record: dict | None, run: BenchRun | None) -> Row:
    target = figure.target or (record or {}).get("target", "")
    if record is None:
        return Row(
            figure.bench,
            figure.metric,
            figure.label,
            figure.unit,
            target,
            None,
            "",
            _missing_why(run),
            expected=True,
        )
    return Row(
        figure.bench,
        figure.metric,
        figure.label,
        figure.unit,
        target,
        float(record["value"]),
        record.get("note", ""),
        "",
        expected=True,
    )


def format_value(value: float, unit: str) -> str:
    if math.isnan(value):
        return "nan"
    if unit == "ratio":
        return f"{value:.3f}"
    if unit == "count":
        return f"{value:.0f}"
    number = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{number} {unit}".strip()


def verdict(row: Row) -> str:
    met = row.met
    if met is None:
        return "—"
    return "yes" if met else "**no**"
