"""Writes a Llama checkpoint (random weights, local tokenizer) that vLLM loads offline."""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvscope.model.corpus import sentences
from kvscope.model.shapes import SHAPES, ModelShape, default_model_dir

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>")


def build_model(out: Path, shape: str | ModelShape = "tiny", seed: int = 0) -> Path:
    """Writes config, weights and tokenizer into out; byte-identical for one shape and seed.

    `shape` is a SHAPES name, or a ModelShape (tests build cut-down variants of a shape)."""
    spec = SHAPES[shape] if isinstance(shape, str) else shape
    out.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(out, spec, seed)
    save_file(_random_weights(spec, seed), out / "model.safetensors", metadata={"format": "pt"})
    _write_json(out / "config.json", _config(spec))
    _write_json(out / "generation_config.json", {"bos_token_id": 0, "eos_token_id": 1})
    return out


def ensure_model(shape: str = "tiny", seed: int = 0) -> Path:
    """The cached model of a shape and seed (default_model_dir), built first if absent."""
    out = default_model_dir(shape, seed)
    if not (out / "config.json").is_file():  # written last: its presence means complete
        build_model(out, shape, seed)
    return out


def _random_weights(spec: ModelShape, seed: int) -> dict[str, torch.Tensor]:
    # Scaled so each layer keeps unit variance: outputs then depend on the context, which
    # makes "same greedy tokens with and without a connector" a test that can fail.
    gen = torch.Generator().manual_seed(seed)
    h, kv, inter = (
        spec.hidden_size,
        spec.num_key_value_heads * spec.head_dim,
        spec.intermediate_size,
    )

    def normal(rows: int, cols: int, std: float) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen) * std).to(torch.bfloat16)

    weights = {"model.embed_tokens.weight": normal(spec.vocab_size, h, 1.0)}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        weights |= {
            p + "self_attn.q_proj.weight": normal(h, h, 2.0 / h**0.5),
            p + "self_attn.k_proj.weight": normal(kv, h, 2.0 / h**0.5),
            p + "self_attn.v_proj.weight": normal(kv, h, 1.0 / h**0.5),
            p + "self_attn.o_proj.weight": normal(h, h, 1.0 / h**0.5),
            p + "mlp.gate_proj.weight": normal(inter, h, 1.0 / h**0.5),
            p + "mlp.up_proj.weight": normal(inter, h, 1.0 / h**0.5),
            p + "mlp.down_proj.weight": normal(h, inter, 1.0 / inter**0.5),
            p + "input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        }
    weights["model.norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    weights["lm_head.weight"] = normal(spec.vocab_size, h, 4.0 / h**0.5)
    return weights


def _write_tokenizer(out: Path, spec: ModelShape, seed: int) -> None:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences(seed, 4000), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    bos, eos, pad = SPECIAL_TOKENS
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": bos,
            "eos_token": eos,
            "pad_token": pad,
            "add_bos_token": False,
            "model_max_length": spec.max_position_embeddings,
            "clean_up_tokenization_spaces": False,
        },
    )
    _write_json(
        out / "special_tokens_map.json", {"bos_token": bos, "eos_token": eos, "pad_token": pad}
    )


def _config(spec: ModelShape) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
    }


def _write_json(path: Path, value: dict) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
