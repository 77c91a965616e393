"""Reads an engine's state: its scheduler, its KV connector halves, what they still hold."""

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


# --- worker processes: llm.collective_rpc(fn) runs fn(worker) on every rank --------------------
# Under vLLM's default executor (and at any tensor-parallel size) the worker halves live in
# worker processes. These functions are sent by reference (they import from an installed
# module), which vLLM accepts with VLLM_ALLOW_INSECURE_SERIALIZATION=1, and return plain data.


def worker_leaks(worker: Any = None) -> list[str]:
    """What this rank's worker-side connector still holds, in words; empty when it holds nothing."""
    problems = []
    for name, core in _worker_cores(worker_connector(None)):
        held = _worker_core_leaks(core)
        problems += [f"{name}: {what} = {value!r}" for what, value in held.items() if value]
    return problems


def worker_stats(worker: Any = None) -> dict[str, Any]:
    """This rank's tensor-parallel rank and each connector core's transfer counters."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

    stats: dict[str, Any] = {"tp_rank": get_tensor_model_parallel_rank()}
    for name, core in _worker_cores(worker_connector(None)):
        half = getattr(core, "worker", None)
        stats[name] = dict(getattr(half, "stats", None) or {})
    return stats


def _worker_cores(connector: Any) -> list[tuple[str, Any]]:
    """(name, core) of the connector and, in a Multi, each child (by its name)."""
    cores = [(type(connector).__name__, connector)]
    for child in getattr(connector, "children", []):
        inner = getattr(child.connector, "inner", child.connector)
        cores.append((child.name, inner))
    return cores


def _worker_core_leaks(core: Any) -> dict[str, Any]:
    import time

    kind, half = type(core).__name__, getattr(core, "worker", None)
    if kind == "CpuOffloadCore":
        # A cancelled copy leaves the copy thread's queue when that thread next runs.
        deadline = time.monotonic() + 5
        while half.copies and half.copies.num_pending and time.monotonic() < deadline:
            time.sleep(0.02)
        return {
            "copies_pending": list(half._pending),
            "copy_jobs": half.copies.num_pending if half.copies else 0,
        }
    if kind == "P2PCore":
        puller, lender = half.puller, half.lender
        return {
            "reads_in_flight": list(puller._reads) if puller else [],
            "handshakes_in_flight": list(puller._handshakes) if puller else [],
            "lender_held": list(lender.lent) if lender else [],
        }
    if kind == "MultiCore":
        return {
            "routes": list(half.routes),
            "failed_blocks": half.failed_blocks,
            "extra_saves": half.extra_saves,
            "loads_held_back": half.loads_held_back,
        }
    return {}
