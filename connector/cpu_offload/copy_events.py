"""Span events of the worker half's copies: each copy's transfer, a finished load, a failed one."""

from kvscope.connector.cpu_offload.copy.engine import CopyResult, Direction
from kvscope.connector.cpu_offload.metadata import BlockTransfer
from kvscope.traces import names
from kvscope.traces.facts import add_event, record_transfer


def copy_recorded(transfer: BlockTransfer, direction: Direction, result: CopyResult) -> None:
    """The copy as a transfer of the request's span (peer "host"), failed or not."""
    record_transfer(
        transfer.req_id,
        direction.value,
        result.num_bytes,
        result.finished_at - result.duration_s,
        result.finished_at,
        error=result.error,
        **{names.TRANSFER_PEER: "host", names.BLOCK_COUNT: result.num_blocks},
    )


def blocks_loaded(transfer: BlockTransfer) -> None:
    add_event(
        names.EVENT_BLOCK_LOADED,
        **{
            names.REQUEST_ID: transfer.req_id,
            names.BLOCK_TIER: "device",
            names.BLOCK_IDS: list(transfer.device_block_ids),
        },
        **_group_attribute(transfer),
    )


def load_failed(
    transfer: BlockTransfer, cause: str, failure_policy: str | None, failure_outcome: str | None
) -> None:
    """failure_outcome: what vLLM does with it; None when a parent (the Multi) says so."""
    outcome = {names.FAILURE_OUTCOME: failure_outcome} if failure_outcome else {}
    add_event(
        names.EVENT_LOAD_FAILED,
        **{
            names.REQUEST_ID: transfer.req_id,
            names.FAILURE_CAUSE: cause,
            names.BLOCK_COUNT: len(transfer.device_block_ids),
            names.BLOCK_IDS: list(transfer.device_block_ids),
            names.FAILURE_POLICY: failure_policy or "recompute",
        },
        **outcome,
        **_group_attribute(transfer),
    )


def _group_attribute(transfer: BlockTransfer) -> dict[str, list[int]]:
    """The KV cache group of each device block id (ids are addresses within a group)."""
    return {names.KV_CACHE_GROUP_IDS: list(transfer.group_ids)} if transfer.group_ids else {}
