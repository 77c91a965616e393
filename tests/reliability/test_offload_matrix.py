"""The fault matrix for the CPU offload connector: one engine per policy, faults at runtime."""

import pytest

from tests.reliability import scenarios
from tests.reliability.cases import cases_for
from tests.reliability.configs import offload_config
from tests.reliability.matrix import cell_params, check_cell, matrix_fixtures

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CELLS = cases_for("offload")
engines, runs = matrix_fixtures(offload_config, faults="offload")


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


@pytest.mark.parametrize(("case", "check"), cell_params(CELLS))
def test_cell(case, check, engines, runs, recorder, expected):
    check_cell(
        case,
        check,
        SCENARIOS[case.fault],
        engines=engines,
        runs=runs,
        recorder=recorder,
        expected=expected,
    )
