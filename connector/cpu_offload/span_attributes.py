"""Span event attributes of the offload scheduler half's blocks and leases, groups named."""

from typing import Any

from kvscope.connector.cpu_offload.leases import Lease
from kvscope.traces import names
from kvscope.traces.attributes import compact_hash


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
