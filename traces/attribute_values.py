"""Turns vLLM objects and hook results into span attributes: small, bounded, never raising."""

from collections.abc import Iterable, Mapping
from typing import Any

from kvscope.traces import names

MAX_LIST = 256
"""Longest list kept in one attribute; longer ones are cut (the count attribute stays exact)."""

MAX_TEXT = 200
"""Longest text kept for a hook result."""


def int_list(values: Iterable[int]) -> list[int]:
    out = []
    for i, value in enumerate(values):
        if i == MAX_LIST:
            break
        out.append(int(value))
    return out


def str_list(values: Iterable[Any]) -> list[str]:
    return [str(v) for _, v in zip(range(MAX_LIST), values, strict=False)]


def short_text(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 3] + "..."


def compact_hash(block_hash: Any) -> str:
    """The first 8 bytes of a block hash in hex (vLLM's BlockHash is bytes)."""
    if isinstance(block_hash, bytes | bytearray):
        return bytes(block_hash[:8]).hex()
    return short_text(block_hash)[:16]


def request_attributes(request: Any) -> dict[str, Any]:
    """Id and prompt length of a vLLM Request."""
    return {
        names.REQUEST_ID: str(request.request_id),
        names.PROMPT_TOKENS: int(getattr(request, "num_prompt_tokens", 0) or 0),
    }


def lookup_attributes(num_computed_tokens: int, result: tuple[int | None, bool]) -> dict[str, Any]:
    """Attributes of get_num_new_matched_tokens: local hit, external hit, async load."""
    external, is_async = result
    attributes: dict[str, Any] = {
        names.TOKENS_LOCAL_HIT: int(num_computed_tokens),
        names.LOAD_ASYNC: bool(is_async),
        names.TOKENS_EXTERNAL_PENDING: external is None,
    }
    if external is not None:
        attributes[names.TOKENS_EXTERNAL_HIT] = int(external)
    return attributes


def kv_blocks_ids(blocks: Any) -> list[int]:
    """Block ids of a KVCacheBlocks (first KV cache group) or of a list of id lists."""
    try:
        groups = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else blocks
        first = groups[0] if groups and isinstance(groups[0], list | tuple) else groups
        return int_list(first or ())
    except (AttributeError, IndexError, TypeError):
        return []


def block_ids_attributes(key: str, block_ids: Iterable[int]) -> dict[str, Any]:
    ids = list(block_ids)
    return {key: int_list(ids), names.BLOCK_COUNT: len(ids)}


def finished_attributes(sending: Iterable[str] | None, recving: Iterable[str] | None) -> dict:
    return {
        names.FINISHED_SENDING: str_list(sorted(sending or ())),
        names.FINISHED_RECVING: str_list(sorted(recving or ())),
    }


def kv_caches_attributes(kv_caches: Mapping[str, Any]) -> dict[str, Any]:
    """Layer count, shape and total bytes of the engine's KV cache tensors."""
    total = 0
    shape = ""
    for tensor in kv_caches.values():
        total += tensor.numel() * tensor.element_size()
        shape = shape or f"{list(tensor.shape)} {tensor.dtype}"
    return {
        names.LAYER_COUNT: len(kv_caches),
        names.KV_CACHE_BYTES: total,
        names.KV_CACHE_LAYER_SHAPE: shape,
    }
