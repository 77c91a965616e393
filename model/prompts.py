"""Prompts of an exact token length for a built model: the corpus encoded by its tokenizer."""

from functools import cache
from pathlib import Path

from tokenizers import Tokenizer

from kvscope.model.corpus import sentences


@cache
def _tokenizer(model: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model / "tokenizer.json"))


def encode(model: Path, text: str) -> list[int]:
    """Token ids of text with the model's tokenizer (no special tokens)."""
    return _tokenizer(model).encode(text, add_special_tokens=False).ids


def token_prompt(model: Path, tokens: int, seed: int = 0, head: str = "") -> list[int]:
    """`tokens` token ids: `head` (which makes the first block differ), then corpus text.

    The same model, length, seed and head always give the same ids."""
    if tokens < 1:
        raise ValueError(f"a prompt needs at least one token, not {tokens}")
    ids = encode(model, head) if head else []
    batch = 0
    while len(ids) < tokens:  # ~12 tokens a sentence: a few batches reach 4k tokens
        ids += encode(model, " " + " ".join(sentences(seed * 1000 + batch, 200)))
        batch += 1
    return ids[:tokens]
