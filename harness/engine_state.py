"""Reads an engine's state: its scheduler, its KV connector and each connector core under it."""

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
    from kvscope.connector.cpu_offload.host_pool import BlockState
    from kvscope.traces.attribute_values import compact_hash

    offload = scheduler_connector(llm).scheduler
    pool = offload.pool
    stored = {
        host_block_id: compact_hash(pool.key_of(host_block_id))
        for host_block_id in range(pool.num_blocks)
        if pool.key_of(host_block_id) is not None
        and pool.state_of(pool.key_of(host_block_id)) is BlockState.COMMITTED
    }
    return {"stored": stored, "leases": [lease.lease_id for lease in offload.leases.active()]}


def innermost(connector: Any) -> Any:
    """The connector under every tracing wrapper (each exposes the one it wraps as .inner)."""
    for _ in range(8):
        inner = getattr(connector, "inner", None)
        if inner is None or inner is connector:
            break
        connector = inner
    return connector


def connector_cores(connector: Any, name: str | None = None) -> list[tuple[str, Any]]:
    """(name, core) of a connector under its wrappers and, for a Multi, of each child by its
    name, depth first: the cores whose held() and stats say what the engine's KV transfer holds."""
    core = innermost(connector)
    cores = [(name or type(core).__name__, core)]
    for child in getattr(core, "children", None) or []:
        cores += connector_cores(child.connector, child.name)
    return cores


# --- worker processes: llm.collective_rpc(fn) runs fn(worker) on every rank --------------------
# Under vLLM's default executor (and at any tensor-parallel size) the worker halves live in
# worker processes. These functions are sent by reference (they import from an installed
# module), which vLLM accepts with VLLM_ALLOW_INSECURE_SERIALIZATION=1, and return plain data.
# harness/leaks.py's worker_leaks is one of them.


def worker_stats(worker: Any = None) -> dict[str, Any]:
    """This rank's tensor-parallel rank and each connector core's transfer counters."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    stats: dict[str, Any] = {"tp_rank": get_tensor_model_parallel_rank()}
    for name, core in connector_cores(worker_connector(None)):
        counters = getattr(getattr(core, "worker", None), "stats", None)
        # A half's counters are a stats_schema.Counters dataclass, or already its wire dict.
        as_dict = getattr(counters, "as_dict", None)
        stats[name] = as_dict() if callable(as_dict) else dict(counters or {})
    return stats
