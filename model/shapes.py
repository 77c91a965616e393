"""Shapes of the models kvscope builds: tiny ones for tests, a mid one for the benches."""

from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path.home() / ".cache" / "kvscope" / "models"
"""Where built models live unless told otherwise."""


def default_model_dir(shape: str = "tiny", seed: int = 0) -> Path:
    """Where `kvscope model build` writes a shape and seed unless told otherwise."""
    return DEFAULT_DIR / f"{shape}-seed{seed}"


@dataclass(frozen=True)
class ModelShape:
    """Llama hyper-parameters; head_dim is hidden_size // num_attention_heads."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = 2048
    max_position_embeddings: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def parameter_count(self) -> int:
        """Weights in the checkpoint build_model writes (untied embedding and lm_head)."""
        h, kv, inter = (
            self.hidden_size,
            self.num_key_value_heads * self.head_dim,
            self.intermediate_size,
        )
        layer = 2 * h * h + 2 * kv * h + 3 * inter * h + 2 * h
        return self.num_hidden_layers * layer + 2 * self.vocab_size * h + h

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 keys and values of one token over all layers."""
        return self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2 * 2


SHAPES: dict[str, ModelShape] = {
    # The default: 2 layers, grouped-query attention, head_dim 32.
    "tiny": ModelShape("tiny", 128, 256, 2, 4, 2),
    # A second shape so tests are not tuned to one: more layers, head_dim 64, one KV head.
    "tiny-deep": ModelShape("tiny-deep", 128, 384, 3, 2, 1),
    # The bench shape, where prefill dominates and KV reuse matters: 16 layers, hidden 1024,
    # 16 heads of 64 over 4 KV heads (GQA), 184M parameters, 16 KiB of KV per token, positions
    # up to 8192 (4k-token prefixes with room for output). Measured on vLLM's CPU engine here
    # (one thread, AVX-512 bf16, idle machine), one prefill: 0.6 s at 1k tokens, 2.2 s at 2k,
    # 4.2-4.7 s at 4k; a 78M shape (12 layers, hidden 768) took 0.7 s at 2k, where a scheduler
    # step and a copy are still a visible part of TTFT. Larger (hidden 1024 with a 4096 MLP,
    # 243M) would put a 4k prefill near 6 s, and the P/D bench, which prefills every request
    # twice on the plain pair at three lengths on five pairs, past its budget within `make
    # bench` on 2 shared cores. The vocabulary stays the local tokenizer's 2048: only the last
    # token meets the lm_head in a prefill, so a real model's 32k-150k would change little here.
    "mid": ModelShape("mid", 1024, 2816, 16, 16, 4, max_position_embeddings=8192),
}
