"""The figures the report expects, in table order: one module of rows per kind of bench."""

from kvscope.bench.report.figures.backend import BACKEND_FIGURES
from kvscope.bench.report.figures.convoys import CONVOY_FIGURES
from kvscope.bench.report.figures.engine import ENGINE_FIGURES
from kvscope.bench.report.figures.figure import Figure, target_bound, target_met
from kvscope.bench.report.figures.pd import PD_FIGURES
from kvscope.bench.report.figures.soak import SOAK_FIGURES

__all__ = ["ALIASES", "FIGURES", "Figure", "canonical", "target_bound", "target_met"]

FIGURES: list[Figure] = [
    *ENGINE_FIGURES,
    *CONVOY_FIGURES,
    *PD_FIGURES,
    *BACKEND_FIGURES,
    *SOAK_FIGURES,
]
"""Every expected figure: bench, metric, unit, target, in the report's table order.

Naming (for benches calling `kvscope.bench.common.results.record`): `bench` is the bench's
module name under its subject folder of `kvscope.bench` (`copy_bandwidth`, `soak`); `metric` is
snake_case; a ratio is named `<what>_over_<baseline>` and has unit "ratio"; an absolute figure
ends with its unit (`timeline_p95_ms`, `idle_cpu_owner_pct`). The target here wins over the one
a bench records; a figure a bench records that is not listed here still appears in the report,
under "Other recorded figures". To match a bench's own names, either rename the row or add the
bench's name to ALIASES; nothing else in the report needs to change."""

ALIASES: dict[tuple[str, str], str] = {}
"""(bench, metric as the bench records it) -> the metric name in FIGURES."""


def canonical(bench: str, metric: str) -> str:
    """The FIGURES name of a metric a bench recorded."""
    return ALIASES.get((bench, metric), metric)
