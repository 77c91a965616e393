"""Span event attributes of the offload scheduler half's blocks, leases and lookups."""

from typing import Any

from kvscope.connector.cpu_offload.leases import Lease
from kvscope.traces import names
from kvscope.traces.attributes import compact_hash
from kvscope.traces.events import add_event


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


def looked_up(keys: list[bytes], block_size: int, pool_blocks: int) -> None:
    """The event of what a lookup asked the pool, in order, with the block and pool sizes."""
    add_event(
        names.EVENT_BLOCK_LOOKED_UP,
        **{
            names.BLOCK_HASHES: [compact_hash(key) for key in keys],
            names.BLOCK_COUNT: len(keys),
            names.BLOCK_SIZE: block_size,
            names.HOST_POOL_BLOCKS: pool_blocks,
        },
    )
