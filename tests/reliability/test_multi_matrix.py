"""The fault matrix for the Multi (P2P, then CPU offload): decode here, prefill peers apart."""

import pytest

from tests.reliability.cases import cases_for
from tests.reliability.configs import multi_config
from tests.reliability.engine_ops import SMALL_ENGINE, EngineSlot
from tests.reliability.matrix import apply_check, cell_params
from tests.reliability.record import cell_run
from tests.reliability.scenarios import Cell
from tests.reliability.scenarios_pd import MULTI_ONLY, SCENARIOS

pytestmark = [pytest.mark.engine, pytest.mark.slow]
CELLS = cases_for("multi")


@pytest.fixture(scope="module")
def engines(tiny_model, matrix_dir):
    faults_path = matrix_dir / "multi-faults.json"
    faults_path.write_text("{}")
    slot = EngineSlot(tiny_model, lambda policy: multi_config(policy, faults_path), **SMALL_ENGINE)
    slot.faults_path = faults_path
    yield slot
    slot.close()


@pytest.fixture(scope="module")
def runs() -> dict:
    return {}


@pytest.mark.parametrize(("case", "check"), cell_params(CELLS))
def test_cell(case, check, engines, runs, recorder, expected, prefill, victim):
    def make():
        llm = engines.get(case.policy)
        cell = Cell(case, llm, recorder.backend, recorder, engines.faults_path, prefill, victim)
        scenario = (SCENARIOS | MULTI_ONLY)[case.fault]
        return recorder.record(case, llm, lambda: scenario(cell), peer=prefill)

    apply_check(check, cell_run(runs, case, make), expected)
