"""The fault matrix for the Multi (P2P, then CPU offload): decode here, prefill peers apart."""

import pytest

from tests.reliability.cases import cases_for
from tests.reliability.configs import multi_config
from tests.reliability.matrix import cell_params, check_cell, matrix_fixtures
from tests.reliability.scenarios_pd import MULTI_ONLY, SCENARIOS

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CELLS = cases_for("multi")
engines, runs = matrix_fixtures(multi_config, faults="multi")


@pytest.mark.parametrize(("case", "check"), cell_params(CELLS))
def test_cell(case, check, engines, runs, recorder, expected, prefill, victim):
    check_cell(
        case,
        check,
        (SCENARIOS | MULTI_ONLY)[case.fault],
        engines=engines,
        runs=runs,
        recorder=recorder,
        expected=expected,
        prefill=prefill,
        victim=victim,
    )
