"""What the three connector modules share: their engine fixtures, cells parametrized by check,
one cell run shared by its checks."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.cases import CHECKS, Case
from tests.reliability.checks import CellRun, check_backend, check_leaks, check_outcome
from tests.reliability.engine_ops import SMALL_ENGINE, EngineSlot
from tests.reliability.record import cell_run
from tests.reliability.scenarios import Cell

KnownBug = Callable[[Case, str], str | None]
"""(case, check) -> why that check fails today (a strict xfail), or None."""
Scenario = Callable[[Cell], Any]


def cell_params(cells: list[Case], known_bug: KnownBug = lambda case, check: None) -> list:
    """(case, check) params in run order, a cell's three checks together."""
    params = []
    for case in cells:
        for check in CHECKS:
            reason = known_bug(case, check)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(
                pytest.param(case, check, id=f"{case.fault}-{case.policy}-{check}", marks=marks)
            )
    return params


def matrix_fixtures(config: Callable[..., dict], faults: str | None = None) -> tuple[Any, Any]:
    """A matrix module's `engines` (one in-process engine per policy, kv_transfer_config
    config(policy), or config(policy, faults_path) when the cells change an offload fault plan
    named `faults` at runtime) and `runs` (each cell's record, shared by its three checks)."""

    @pytest.fixture(scope="module", name="engines")
    def engines(tiny_model: Path, matrix_dir: Path):
        faults_path = None
        if faults is not None:
            faults_path = matrix_dir / f"{faults}-faults.json"
            faults_path.write_text("{}")
        slot = EngineSlot(
            tiny_model,
            (lambda policy: config(policy, faults_path)) if faults_path else config,
            **SMALL_ENGINE,
        )
        slot.faults_path = faults_path
        yield slot
        slot.close()

    @pytest.fixture(scope="module", name="runs")
    def runs() -> dict:
        return {}

    return engines, runs


def check_cell(
    case: Case,
    check: str,
    scenario: Scenario,
    *,
    engines: EngineSlot,
    runs: dict,
    recorder: Any,
    expected: dict[str, list[int]],
    prefill: Any = None,
    victim: Any = None,
) -> None:
    """Runs the cell once (its first check does) on the engine of its policy, then applies
    this check to its record."""

    def make() -> CellRun:
        llm = engines.get(case.policy)
        cell = Cell(case, llm, recorder.backend, recorder, engines.faults_path, prefill, victim)
        return recorder.record(case, llm, lambda: scenario(cell), peer=prefill)

    apply_check(check, cell_run(runs, case, make), expected)


def apply_check(check: str, run: CellRun, expected: dict[str, list[int]]) -> None:
    {
        "outcome": lambda: check_outcome(run, expected),
        "leaks": lambda: check_leaks(run),
        "backend": lambda: check_backend(run),
    }[check]()
