"""The fault matrix for the P2P connector: decode engine here, prefill peers in subprocesses."""

import pytest

from tests.reliability.cases import cases_for
from tests.reliability.configs import p2p_config
from tests.reliability.matrix import cell_params, check_cell, matrix_fixtures
from tests.reliability.scenarios_pd import SCENARIOS

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CELLS = cases_for("p2p")
engines, runs = matrix_fixtures(p2p_config)


@pytest.mark.parametrize(("case", "check"), cell_params(CELLS))
def test_cell(case, check, engines, runs, recorder, expected, prefill, victim):
    check_cell(
        case,
        check,
        SCENARIOS[case.fault],
        engines=engines,
        runs=runs,
        recorder=recorder,
        expected=expected,
        prefill=prefill,
        victim=victim,
    )
