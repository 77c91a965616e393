"""The fault matrix for the P2P connector: decode engine here, prefill peers in subprocesses."""

import pytest

from tests.reliability.cases import cases_for
from tests.reliability.configs import p2p_config
from tests.reliability.engine_ops import SMALL_ENGINE, EngineSlot
from tests.reliability.matrix import apply_check, cell_params
from tests.reliability.record import cell_run
from tests.reliability.scenarios import Cell
from tests.reliability.scenarios_pd import SCENARIOS

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CELLS = cases_for("p2p")


@pytest.fixture(scope="module")
def engines(tiny_model):
    slot = EngineSlot(tiny_model, p2p_config, **SMALL_ENGINE)
    yield slot
    slot.close()


@pytest.fixture(scope="module")
def runs() -> dict:
    return {}


@pytest.mark.parametrize(("case", "check"), cell_params(CELLS))
def test_cell(case, check, engines, runs, recorder, expected, prefill, victim):
    def make():
        llm = engines.get(case.policy)
        cell = Cell(case, llm, recorder.backend, recorder, peer=prefill, victim=victim)
        return recorder.record(case, llm, lambda: SCENARIOS[case.fault](cell), peer=prefill)

    apply_check(check, cell_run(runs, case, make), expected)
