"""A request vLLM preempted, re-admitted with a hit from the host pool and aborted while that
load runs: freed once (vLLM's own wait for finished_recving), tokens of the others unchanged."""

import pytest

from kvscope.harness.configs import offload_config
from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import engine_scheduler, scheduler_connector
from kvscope.harness.prompts import long_prompt
from tests.reliability.engine_ops import SMALL_ENGINE, Batch, run, set_faults, settle
from tests.reliability.leaks import engine_leaks

pytestmark = pytest.mark.engine
PROMPTS = [f"[preempt-abort #{i}] " + long_prompt(i, 6) for i in range(4)]
"""4 requests of 5 blocks that grow by 5 while decoding: 24 blocks cannot hold them all."""
MAX_TOKENS = 160


class PreemptedThenLoading:
    """abort_when for engine_ops.run: names a request once it is loading after a preemption,
    and remembers what request_finished answered for it."""

    def __init__(self, llm) -> None:
        self.offload = scheduler_connector(llm).scheduler
        self.preempted: set[str] = set()
        self.aborted: dict[str, bool] = {}  # req id -> request_finished's answer
        scheduler = engine_scheduler(llm)
        preempt, finished = scheduler._preempt_request, self.offload.finished

        def preempt_request(request, *args, **kwargs):
            self.preempted.add(request.request_id)
            return preempt(request, *args, **kwargs)

        def request_finished(request):
            answer = finished(request)
            if request.request_id in self.aborted:
                self.aborted[request.request_id] = answer
            return answer

        scheduler._preempt_request = preempt_request
        self.offload.finished = request_finished

    def __call__(self) -> list[str]:
        """vLLM's ids are ours plus '-<suffix>'; abort_request takes ours."""
        for req_id, state in self.offload.requests.items():
            if state.loading and req_id in self.preempted and req_id not in self.aborted:
                self.aborted[req_id] = None
                return [req_id.rsplit("-", 1)[0]]
        return []


def test_preempted_readmitted_with_a_hit_then_aborted(tiny_model, tmp_path):
    faults_path = tmp_path / "faults.json"
    faults_path.write_text("{}")
    with in_process_llm(tiny_model, **SMALL_ENGINE) as llm:
        expected = run(llm, [f"e{i}" for i in range(4)], PROMPTS, MAX_TOKENS)
    config = offload_config(load_timeout_s=5.0, faults_path=str(faults_path))
    with in_process_llm(tiny_model, config, **SMALL_ENGINE) as llm:
        watch = PreemptedThenLoading(llm)
        set_faults(faults_path, {"load_delay_ms": 800.0})  # loads outlast a few steps
        batch: Batch = run(llm, [f"r{i}" for i in range(4)], PROMPTS, MAX_TOKENS, abort_when=watch)
        settle(llm)
        leaks = engine_leaks(llm)
    assert batch.preemptions > 0 and watch.aborted, "no preempted request was re-admitted "
    "with a hit and aborted during its load: the test tested nothing"
    assert set(watch.aborted.values()) == {False}, "True would have vLLM free it twice"
    assert leaks == []
    assert len(batch.results) == len(PROMPTS) - len(watch.aborted)
    for req_id, finished in batch.results.items():
        assert finished.tokens == expected.results["e" + req_id[1:]].tokens, req_id
