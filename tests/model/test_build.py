"""The models: deterministic per seed, each shape as configured, loadable by vLLM offline."""

import dataclasses
import json
import math

import pytest

from kvscope.model.build import build_model
from kvscope.model.prompts import token_prompt
from kvscope.model.shapes import SHAPES

TINY_SHAPES = ("tiny", "tiny-deep")


def test_same_seed_gives_byte_identical_files(tmp_path):
    first = build_model(tmp_path / "a", seed=7)
    second = build_model(tmp_path / "b", seed=7)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_other_seed_gives_other_weights(tmp_path):
    first = build_model(tmp_path / "a", seed=1)
    second = build_model(tmp_path / "b", seed=2)
    assert (first / "model.safetensors").read_bytes() != (second / "model.safetensors").read_bytes()


@pytest.mark.parametrize("shape", TINY_SHAPES)
def test_each_shape_has_its_config(tmp_path, shape):
    config = json.loads((build_model(tmp_path, shape=shape) / "config.json").read_text())
    spec = SHAPES[shape]
    assert config["num_hidden_layers"] == spec.num_hidden_layers
    assert config["num_key_value_heads"] == spec.num_key_value_heads
    assert config["head_dim"] == spec.head_dim


def _one_layer_mid():
    return dataclasses.replace(SHAPES["mid"], num_hidden_layers=1)


def test_mid_shape_is_a_small_real_model():
    mid = SHAPES["mid"]
    assert 12 <= mid.num_hidden_layers <= 16 and 768 <= mid.hidden_size <= 1024
    assert mid.head_dim == 64 and 2 <= mid.num_key_value_heads <= 4
    assert mid.num_attention_heads % mid.num_key_value_heads == 0  # GQA groups
    assert 50e6 < mid.parameter_count < 400e6
    assert mid.max_position_embeddings >= 4096 + 512  # 4k-token prefixes with room for output


def test_mid_shape_builds_deterministically_and_as_configured(tmp_path):
    # One layer of the mid shape: the same writer, seconds instead of a 370 MB checkpoint.
    from safetensors import safe_open

    first = build_model(tmp_path / "a", shape=_one_layer_mid())
    second = build_model(tmp_path / "b", shape=_one_layer_mid())
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    config = json.loads((first / "config.json").read_text())
    assert (config["hidden_size"], config["head_dim"], config["num_key_value_heads"]) == (
        1024,
        64,
        4,
    )
    assert config["max_position_embeddings"] == SHAPES["mid"].max_position_embeddings
    with safe_open(first / "model.safetensors", "pt") as weights:
        keys = list(weights.keys())  # noqa: SIM118 (safe_open is not iterable)
        count = sum(math.prod(weights.get_slice(key).get_shape()) for key in keys)
    assert count == _one_layer_mid().parameter_count


def test_token_prompts_have_the_asked_length_and_repeat(tiny_model):
    first = token_prompt(tiny_model, 2048, seed=3, head="Request 1: ")
    assert len(first) == 2048
    assert first == token_prompt(tiny_model, 2048, seed=3, head="Request 1: ")
    assert first[:8] != token_prompt(tiny_model, 2048, seed=3, head="Request 2: ")[:8]
    with pytest.raises(ValueError, match="at least one token"):
        token_prompt(tiny_model, 0)


def test_tokenizer_round_trips_text(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    text = "The prefill engine sends 42 blocks to the decode engine."
    ids = tokenizer(text)["input_ids"]
    assert 5 < len(ids) < len(text)
    assert tokenizer.decode(ids) == text


@pytest.mark.engine
def test_vllm_generates_from_both_shapes(tmp_path, tiny_model):
    from kvscope.harness.engine import in_process_llm
    from kvscope.harness.oracle import greedy_tokens

    prompts = ["A quick brown fox jumps over the lazy dog", "Cache block layer token"]
    for model in (tiny_model, build_model(tmp_path / "deep", shape="tiny-deep")):
        with in_process_llm(model) as llm:
            tokens = greedy_tokens(llm, prompts, max_tokens=8)
        assert [len(t) for t in tokens] == [8, 8]
        assert tokens[0] != tokens[1], "outputs should depend on the prompt"
