"""harness/leaks.py on a Multi of two offload children: a lease is named by the child that holds
it, under the child's name. A module of its own: test_leaks.py's engine stays up for its whole
module, and vLLM keeps one KV connector per process, so two engines must never overlap."""

import pytest

from kvscope.harness import configs
from kvscope.harness.engine import in_process_llm
from kvscope.harness.leaks import engine_leaks
from kvscope.harness.oracle import greedy_tokens
from tests.harness.test_leaks import (
    PROMPTS,
    SETTLE_S,
    finish,
    lease_without_load,
    settled_leaks,
)

pytestmark = pytest.mark.engine


def test_a_multis_child_is_named_by_its_name(tiny_model):
    config = configs.multi_config(configs.offload_child("first"), configs.offload_child("second"))
    with in_process_llm(tiny_model, config) as llm:
        greedy_tokens(llm, PROMPTS)
        assert settled_leaks(llm) == []
        request = lease_without_load(llm, PROMPTS[1], "held-by-a-child")
        problems = engine_leaks(llm, settle_s=SETTLE_S)
        for child in ("first", "second"):  # the Multi asks each child; each leases its copy
            assert f"{child}: tracked_requests = ['held-by-a-child']" in problems, problems
            assert any(p.startswith(f"{child}: active_leases = ") for p in problems), problems
        assert not [p for p in problems if p.startswith("CpuOffloadCore")], problems
        finish(llm, request)
        assert engine_leaks(llm, settle_s=SETTLE_S) == []
