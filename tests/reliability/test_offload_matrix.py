"""The fault matrix for the CPU offload connector: one engine per policy, faults at runtime."""

import pytest

from tests.reliability import scenarios
from tests.reliability.cases import cases_for
from tests.reliability.configs import offload_config
from tests.reliability.engine_ops import SMALL_ENGINE, EngineSlot
from tests.reliability.matrix import apply_check, cell_params
from tests.reliability.record import cell_run

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CELLS = cases_for("offload")


def workload(cell: scenarios.Cell):
    """Stores, then loads from the pool: every kind of span the connector makes."""
    cell.store_then_forget()
    return cell.run()


SCENARIOS = {
    "load_fails": scenarios.offload_load_fails,
    "load_slow": scenarios.offload_load_slow,
    "lease_expires": scenarios.offload_lease_expires,
    "aborted": scenarios.offload_aborted,
    "preempted": scenarios.preempted,
    "backend_down": lambda cell: scenarios.backend_down(cell, lambda: workload(cell)),
    "queue_full": lambda cell: scenarios.queue_full(cell, lambda: workload(cell)),
}


@pytest.fixture(scope="module")
def engines(tiny_model, matrix_dir):
    faults_path = matrix_dir / "offload-faults.json"
    faults_path.write_text("{}")
    slot = EngineSlot(
        tiny_model, lambda policy: offload_config(policy, faults_path), **SMALL_ENGINE
    )
    slot.faults_path = faults_path
    yield slot
    slot.close()


@pytest.fixture(scope="module")
def runs() -> dict:
    return {}


@pytest.mark.parametrize(("case", "check"), cell_params(CELLS))
def test_cell(case, check, engines, runs, recorder, expected):
    def make():
        llm = engines.get(case.policy)
        cell = scenarios.Cell(case, llm, recorder.backend, recorder, engines.faults_path)
        return recorder.record(case, llm, lambda: SCENARIOS[case.fault](cell))

    apply_check(check, cell_run(runs, case, make), expected)
