"""The tiny model: deterministic per seed, two shapes, loadable by vLLM offline."""

import json

import pytest

from kvscope.model.build import build_model
from kvscope.model.shapes import SHAPES


def test_same_seed_gives_byte_identical_files(tmp_path):
    first = build_model(tmp_path / "a", seed=7)
    second = build_model(tmp_path / "b", seed=7)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_other_seed_gives_other_weights(tmp_path):
    first = build_model(tmp_path / "a", seed=1)
    second = build_model(tmp_path / "b", seed=2)
    assert (first / "model.safetensors").read_bytes() != (second / "model.safetensors").read_bytes()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_each_shape_has_its_config(tmp_path, shape):
    config = json.loads((build_model(tmp_path, shape=shape) / "config.json").read_text())
    spec = SHAPES[shape]
    assert config["num_hidden_layers"] == spec.num_hidden_layers
    assert config["num_key_value_heads"] == spec.num_key_value_heads
    assert config["head_dim"] == spec.head_dim


def test_tokenizer_round_trips_text(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = "The prefill engine sends 42 blocks to the decode engine."
    ids = tokenizer(text)["input_ids"]
    assert 5 < len(ids) < len(text)
    assert tokenizer.decode(ids) == text


@pytest.mark.engine
def test_vllm_generates_from_both_shapes(tmp_path, tiny_model):
    from kvscope.demo.engine import in_process_llm
    from kvscope.demo.oracle import greedy_tokens

    prompts = ["A quick brown fox jumps over the lazy dog", "Cache block layer token"]
    for model in (tiny_model, build_model(tmp_path / "deep", shape="tiny-deep")):
        with in_process_llm(model) as llm:
            tokens = greedy_tokens(llm, prompts, max_tokens=8)
        assert [len(t) for t in tokens] == [8, 8]
        assert tokens[0] != tokens[1], "outputs should depend on the prompt"
