"""What an idle engine still holds after a scenario: vLLM's block pool and request table, and
the own state of kvscope's connectors (alone, wrapped in tracing, or as a Multi's children)."""

import time
from typing import Any

from kvscope.harness.engine_state import engine_scheduler, leaked_device_blocks, worker_leaks


def unwrap(connector: Any) -> Any:
    """The connector under every tracing wrapper and facade (each exposes .inner)."""
    for _ in range(8):
        inner = getattr(connector, "inner", None)
        if inner is None or inner is connector:
            break
        connector = inner
    return connector


def engine_leaks(llm: Any, tensor_parallel: bool = False) -> list[str]:
    """Every leak of an idle in-process engine, in words; empty when it holds nothing.
    With tensor parallelism the worker halves live in worker processes: asked over RPC."""
    problems = []
    if (device := leaked_device_blocks(llm)) != 0:
        problems.append(f"vLLM: {device} KV blocks still allocated")
    if requests := list(engine_scheduler(llm).requests):
        problems.append(f"vLLM: requests still tracked {requests}")
    scheduler_half = unwrap(engine_scheduler(llm).connector)
    worker_half = None if tensor_parallel else unwrap(_worker_connector())
    for name, sched, work in _halves(scheduler_half, worker_half):
        problems += [f"{name}: {problem}" for problem in _connector_leaks(sched, work)]
    if tensor_parallel:
        for rank, held in enumerate(llm.collective_rpc(worker_leaks)):
            problems += [f"rank {rank}: {problem}" for problem in held]
    return problems


def _worker_connector() -> Any:
    from vllm.distributed.kv_transfer.kv_transfer_state import get_kv_transfer_group

    return get_kv_transfer_group()


def _halves(scheduler_half: Any, worker_half: Any) -> list[tuple[str, Any, Any]]:
    """(name, scheduler core, worker core) for the connector and, in a Multi, each child."""
    pairs = [(type(scheduler_half).__name__, scheduler_half, worker_half)]
    worker_children = getattr(worker_half, "children", None) or [None] * len(
        getattr(scheduler_half, "children", [])
    )
    for sched, work in zip(getattr(scheduler_half, "children", []), worker_children, strict=True):
        pairs.append((sched.name, unwrap(sched.connector), work and unwrap(work.connector)))
    return pairs


def _connector_leaks(sched: Any, work: Any) -> list[str]:
    """kvscope's connectors' own state; other connectors are judged by vLLM's state alone."""
    kind = type(sched).__name__
    if kind == "CpuOffloadCore":
        return _offload(sched.scheduler, work and work.worker)
    if kind == "P2PCore":
        return _p2p(sched.scheduler, work and work.worker)
    if kind == "MultiCore":
        return _multi(sched.scheduler, work and work.worker)
    if type(sched).__module__.startswith("kvscope."):  # a half of ours this check missed
        return [f"no leak check for {kind}"]
    return []


def _nonempty(**things: Any) -> list[str]:
    return [f"{name} = {value!r}" for name, value in things.items() if value]


def _offload(scheduler: Any, worker: Any) -> list[str]:
    held = _nonempty(
        active_leases=[lease.lease_id for lease in scheduler.leases.active()],
        pinned_host_blocks=scheduler.pool.stats().pinned,
        tracked_requests=list(scheduler.requests),
        stores_in_flight=scheduler._stores,
        expired_leases_in_flight=scheduler.expired_leases_in_flight(),
        stores_reported_by_some_ranks=list(scheduler.store_reports.pending()),
        loads_reported_by_some_ranks=list(scheduler.load_reports.pending()),
    )
    if worker is None:
        return held
    # A cancelled copy leaves the copy thread's queue when that thread next runs: give it time.
    deadline = time.monotonic() + 5
    while worker.copies and worker.copies.num_pending and time.monotonic() < deadline:
        time.sleep(0.02)
    return held + _nonempty(
        worker_copies_pending=list(worker._pending),
        worker_copy_jobs=worker.copies.num_pending if worker.copies else 0,
    )


def _p2p(scheduler: Any, worker: Any) -> list[str]:
    held = _nonempty(
        held_for_readers=list(scheduler.held_for_readers),
        lookups=list(scheduler.lookups),
        pulling=sorted(scheduler.pulling),
        pull_timers=list(scheduler._pull_started),
    )
    if worker is None:
        return held
    puller, lender = worker.puller, worker.lender
    return held + _nonempty(
        reads_in_flight=list(puller._reads) if puller else [],
        handshakes_in_flight=list(puller._handshakes) if puller else [],
        lender_held=list(lender.lent) if lender else [],
    )


def _multi(scheduler: Any, worker: Any) -> list[str]:
    held = _nonempty(
        loads=list(scheduler.loads),
        serving=list(scheduler.serving),
        loads_reported_by_some_ranks=list(scheduler.load_reports.pending()),
    )
    if worker is None:
        return held
    return held + _nonempty(
        routes=list(worker.routes),
        failed_blocks=worker.failed_blocks,
        extra_saves=worker.extra_saves,
        loads_held_back=worker.loads_held_back,
    )
