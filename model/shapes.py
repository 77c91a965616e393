"""Shapes of the tiny models kvscope builds: small for a 2-core CPU, real for vLLM."""

from dataclasses import dataclass


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


SHAPES: dict[str, ModelShape] = {
    # The default: 2 layers, grouped-query attention, head_dim 32.
    "tiny": ModelShape("tiny", 128, 256, 2, 4, 2),
    # A second shape so tests are not tuned to one: more layers, head_dim 64, one KV head.
    "tiny-deep": ModelShape("tiny-deep", 128, 384, 3, 2, 1),
}
