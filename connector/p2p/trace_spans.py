"""The P2P connector's own spans (handshakes with a peer, in the trace of the request that asked)
and the block attributes its lease and load events carry."""

from typing import Any

from kvscope.connector.p2p.metadata import BlockPull
from kvscope.connector.p2p.transport.results import TransferResult
from kvscope.connector.p2p.transport.ucx_lanes import UNKNOWN, ReadLanes
from kvscope.traces import names
from kvscope.traces.facts import record_timed_span


def record_handshake(
    req_id: str, peer: tuple[str, int, str], start_s: float, end_s: float, error: str | None
) -> None:
    """A kvscope.handshake span timed by the monotonic clock; peer is (host, port, engine id)."""
    _host, _port, engine_id = peer
    attributes = {names.TRANSFER_PEER: engine_id}
    record_timed_span(names.SPAN_HANDSHAKE, req_id, start_s, end_s, error, attributes)


def held_block_attributes(block_ids: tuple[tuple[int, ...], ...]) -> dict[str, Any]:
    """Block ids (every group's, in order) and, with several groups, the group of each."""
    attributes: dict[str, Any] = {
        names.BLOCK_IDS: [b for group in block_ids for b in group],
        names.BLOCK_COUNT: sum(len(group) for group in block_ids),
    }
    if len(block_ids) > 1:
        attributes[names.KV_CACHE_GROUP_IDS] = [g for g, ids in enumerate(block_ids) for _ in ids]
    return attributes


def pulled_block_attributes(pull: BlockPull) -> dict:
    """The local block ids a pull wrote, their count and, with several KV cache groups, the
    group of each (kvscope.blocks.group_ids) and the groups it moved."""
    attributes: dict = {names.BLOCK_IDS: pull.flat_local, names.BLOCK_COUNT: len(pull.flat_local)}
    if len(pull.local_block_ids) > 1:
        attributes[names.KV_CACHE_GROUP_IDS] = pull.group_of_blocks
        attributes[names.KV_CACHE_GROUP_COUNT] = len(pull.local_block_ids)
    return attributes


def transport_attributes(result: TransferResult, lanes: ReadLanes, memory: str) -> dict:
    """What NIXL and UCX said they used for one read, and the one window its bytes and time
    come from (kvscope.transport.*)."""
    attributes: dict = {
        names.TRANSPORT_BACKEND: result.nixl.backend if result.nixl else UNKNOWN,
        names.TRANSPORT_UCX_LANES: list(lanes.data),
        names.TRANSPORT_UCX_CONTROL_LANES: list(lanes.control),
        names.TRANSPORT_UCX_SCOPE: lanes.scope,
        names.TRANSPORT_MEMORY: memory,
        names.TRANSPORT_WINDOW: "post_to_done",
    }
    if result.nixl is not None and result.nixl.total_bytes is not None:
        attributes[names.TRANSPORT_NIXL_BYTES] = result.nixl.total_bytes
        attributes[names.TRANSPORT_NIXL_XFER_US] = result.nixl.xfer_us
    return attributes
