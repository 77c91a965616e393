"""Span event attributes of the offload scheduler half's blocks, leases and lookups."""

from collections.abc import Sequence
from typing import Any

from opentelemetry import trace

from kvscope.connector.cpu_offload.leases import Lease
from kvscope.traces import names
from kvscope.traces.attribute_values import compact_hash
from kvscope.traces.buffer import collecting
from kvscope.traces.facts import add_event


def blocks_attributes(
    host_block_ids: list[int], keys: list[bytes], group_ids: list[int]
) -> dict[str, Any]:
    return {
        names.HOST_BLOCK_IDS: list(host_block_ids),
        names.BLOCK_HASHES: [compact_hash(key) for key in keys],
        names.BLOCK_COUNT: len(host_block_ids),
        names.BLOCK_TIER: "host",
        names.KV_CACHE_GROUP_IDS: list(group_ids),
    }


def lease_attributes(lease: Lease, timeout_s: float, group_ids: list[int]) -> dict[str, Any]:
    return {
        names.LEASE_TIMEOUT_S: timeout_s,
        names.LEASE_ID: lease.lease_id,
        names.LEASE_HOLDER: lease.req_id,
        names.HOST_BLOCK_IDS: list(lease.host_block_ids),
        names.BLOCK_HASHES: [compact_hash(key) for key in lease.block_keys],
        names.BLOCK_COUNT: len(lease.host_block_ids),
        names.KV_CACHE_GROUP_IDS: list(group_ids),
    }


def looked_up(
    keys: list[bytes],
    block_size: int,
    pool_blocks: int,
    content_hashes: list[str],
    first_miss_state: str | None,
) -> None:
    """The event of what a lookup asked the pool, in order, with the block and pool sizes, each
    block's content hash and the state of the first block not hit."""
    add_event(
        names.EVENT_BLOCK_LOOKED_UP,
        **{
            names.BLOCK_HASHES: [compact_hash(key) for key in keys],
            names.BLOCK_COUNT: len(keys),
            names.BLOCK_SIZE: block_size,
            names.HOST_POOL_BLOCKS: pool_blocks,
            names.BLOCK_CONTENT_HASHES: content_hashes,
            names.LOOKUP_FIRST_MISS_STATE: first_miss_state,
        },
    )


def lookup_skipped(reason: str) -> None:
    """Marks the lookup span as one that asked no tier, and why."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(names.LOOKUP_SKIPPED, reason)


def recording() -> bool:
    """Whether what the hook being run reports is kept (a span records, or a caller keeps its
    events for one): what is costly to say is said only then."""
    return trace.get_current_span().is_recording() or collecting()


def content_hashes(token_ids: Sequence[int], block_size: int, start: int, end: int) -> list[str]:
    """Blocks [start, end)'s content hashes: each chains the hash of the blocks before it with
    its own token ids, and nothing else (vLLM's block hashes add the cache salt, the LoRA
    adapter and multimodal inputs). Python hashes ints and tuples the same in every process."""
    chained, found = 0, []
    for index in range(end):
        chained = hash((chained, tuple(token_ids[index * block_size : (index + 1) * block_size])))
        if index >= start:
            found.append(f"{chained & 0xFFFFFFFFFFFFFFFF:016x}")
    return found
