"""Looks inside an in-process vLLM engine: its scheduler, its KV connector, leaked blocks."""

from typing import Any


def engine_scheduler(llm: Any) -> Any:
    """The vLLM Scheduler of an in-process LLM (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return llm.llm_engine.engine_core.engine_core.scheduler


def scheduler_connector(llm: Any, unwrap: bool = True) -> Any:
    """The scheduler-side KV connector; unwrap=True returns what kvscope's tracing wraps."""
    connector = engine_scheduler(llm).connector
    return getattr(connector, "inner", connector) if unwrap else connector


def worker_connector(llm: Any, unwrap: bool = True) -> Any:
    """The worker-side KV connector of the in-process worker."""
    from vllm.distributed.kv_transfer.kv_transfer_state import get_kv_transfer_group

    connector = get_kv_transfer_group()
    return getattr(connector, "inner", connector) if unwrap else connector


def leaked_device_blocks(llm: Any) -> int:
    """KV blocks still held (ref count > 0) with no request running: should be 0."""
    block_pool = engine_scheduler(llm).kv_cache_manager.block_pool
    # One block is vLLM's permanent null block.
    return block_pool.num_gpu_blocks - 1 - block_pool.get_num_free_blocks()


def offload_state(llm: Any) -> dict:
    """The CPU offload connector's own view: committed host blocks and active leases."""
    from kvscope.connector.common.host_pool import BlockState
    from kvscope.traces.attributes import compact_hash

    offload = scheduler_connector(llm).scheduler
    pool = offload.pool
    stored = {
        host_block_id: compact_hash(pool.key_of(host_block_id))
        for host_block_id in range(pool.num_blocks)
        if pool.key_of(host_block_id) is not None
        and pool.state_of(pool.key_of(host_block_id)) is BlockState.COMMITTED
    }
    return {"stored": stored, "leases": [lease.lease_id for lease in offload.leases.active()]}
