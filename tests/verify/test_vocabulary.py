"""kvscope verify's prompts fit the model's vocabulary, whatever its size."""

import dataclasses

import pytest

from kvscope.model.build import build_model
from kvscope.model.shapes import SHAPES
from kvscope.verify.connectors import parse_connector
from kvscope.verify.driver import FIRST_TOKEN_ID, in_vocabulary
from kvscope.verify.runner import verify
from kvscope.verify.scenarios import SCENARIOS


def test_ids_are_folded_into_the_vocabulary_and_shared_prefixes_stay_shared():
    prompts = [p for s in SCENARIOS for wave in s.waves for p in wave.prompts]
    assert max(max(p) for p in prompts) >= 1024  # the scenarios do draw past a small vocabulary
    for prompt in prompts:
        folded = in_vocabulary(prompt, 1024)
        assert all(FIRST_TOKEN_ID <= t < 1024 for t in folded)
        assert in_vocabulary(prompt[:64], 1024) == folded[:64]
    assert in_vocabulary(prompts[0], 2048) == list(prompts[0])  # a big enough vocabulary: as drawn


@pytest.mark.engine
def test_verify_runs_on_a_model_with_a_1024_token_vocabulary(tmp_path):
    shape = dataclasses.replace(SHAPES["tiny"], name="tiny-v1024", vocab_size=1024)
    model = build_model(tmp_path / "tiny-v1024", shape)
    spec = parse_connector("CpuOffloadConnector", {"cpu_bytes_to_use": 8 << 20})
    report = verify(spec, model, scenarios=["cold_miss_then_hit"])
    assert [(r.scenario, r.verdict) for r in report.results] == [("cold_miss_then_hit", "pass")]
