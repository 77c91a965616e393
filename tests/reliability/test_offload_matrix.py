"""The fault matrix for the CPU offload connector: one engine per policy, faults at runtime."""

import pytest

from tests.reliability import scenarios
from tests.reliability.cases import CHECKS, cases_for
from tests.reliability.checks import check_backend, check_leaks, check_outcome
from tests.reliability.engine_ops import SMALL_ENGINE, EngineSlot
from tests.reliability.record import cell_run

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CELLS = cases_for("offload")


def offload_config(policy: str, faults_path) -> dict:
    return {
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": policy,
        "kv_connector_extra_config": {
            "cpu_bytes_to_use": 8 << 20,
            "load_timeout_s": 1.5,
            "faults_path": str(faults_path),
        },  # fmt: skip
    }


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
    slot = EngineSlot(tiny_model, lambda policy: offload_config(policy, faults_path),
                      **SMALL_ENGINE)  # fmt: skip
    slot.faults_path = faults_path
    yield slot
    slot.close()


@pytest.fixture(scope="module")
def runs() -> dict:
    return {}


@pytest.mark.parametrize(
    ("case", "check"),
    [pytest.param(case, check, id=f"{case.fault}-{case.policy}-{check}")
     for case in CELLS for check in CHECKS],
)  # fmt: skip
def test_cell(case, check, engines, runs, recorder, expected):
    def make():
        llm = engines.get(case.policy)
        cell = scenarios.Cell(case, llm, recorder.backend, engines.faults_path)
        return recorder.record(case, llm, lambda: SCENARIOS[case.fault](cell))

    run = cell_run(runs, case, make)
    if check == "outcome":
        check_outcome(run, expected)
    elif check == "leaks":
        check_leaks(run)
    else:
        check_backend(run)
