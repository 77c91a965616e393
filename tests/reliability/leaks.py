"""What an engine still holds after a cell, read from the connectors' own state and vLLM's."""

import time
from typing import Any

from kvscope.demo.inspect import (
    engine_scheduler,
    leaked_device_blocks,
    scheduler_connector,
    worker_connector,
)


def engine_leaks(llm: Any) -> list[str]:
    """Every leak of an idle in-process engine, in words; empty when it holds nothing."""
    problems = []
    if (device := leaked_device_blocks(llm)) != 0:
        problems.append(f"vLLM: {device} KV blocks still allocated")
    if requests := list(engine_scheduler(llm).requests):
        problems.append(f"vLLM: requests still tracked {requests}")
    scheduler_half, worker_half = scheduler_connector(llm), worker_connector(llm)
    for name, sched, work in _halves(scheduler_half, worker_half):
        problems += [f"{name}: {problem}" for problem in _connector_leaks(sched, work)]
    return problems


def _halves(scheduler_half: Any, worker_half: Any) -> list[tuple[str, Any, Any]]:
    """(name, scheduler core, worker core) for the connector and, in a Multi, each child."""
    pairs = [(type(scheduler_half).__name__, scheduler_half, worker_half)]
    for sched, work in zip(getattr(scheduler_half, "children", []),
                           getattr(worker_half, "children", []), strict=True):  # fmt: skip
        pairs.append((sched.name, sched.connector, work.connector))
    return pairs


def _connector_leaks(sched: Any, work: Any) -> list[str]:
    kind = type(sched).__name__
    if kind == "CpuOffloadCore":
        return _offload(sched.scheduler, work.worker)
    if kind == "P2PCore":
        return _p2p(sched.scheduler, work.worker)
    if kind == "MultiCore":
        return _multi(sched.scheduler, work.worker)
    return [f"no leak check for {kind}"]


def _nonempty(**things: Any) -> list[str]:
    return [f"{name} = {value!r}" for name, value in things.items() if value]


def _offload(scheduler: Any, worker: Any) -> list[str]:
    # A cancelled copy leaves the copy thread's queue when that thread next runs: give it time.
    deadline = time.monotonic() + 5
    while worker.copies and worker.copies.num_pending and time.monotonic() < deadline:
        time.sleep(0.02)
    return _nonempty(
        active_leases=[lease.lease_id for lease in scheduler.leases.active()],
        pinned_host_blocks=scheduler.pool.stats().pinned,
        tracked_requests=list(scheduler.requests),
        stores_in_flight=scheduler._stores,
        expired_leases_in_flight=scheduler.expired_leases_in_flight(),
        stores_reported_by_some_ranks=list(scheduler.store_reports.pending()),
        loads_reported_by_some_ranks=list(scheduler.load_reports.pending()),
        worker_copies_pending=list(worker._pending),
        worker_copy_jobs=worker.copies.num_pending if worker.copies else 0,
    )


def _p2p(scheduler: Any, worker: Any) -> list[str]:
    puller, lender = worker.puller, worker.lender
    return _nonempty(
        held_for_readers=list(scheduler.held),
        lookups=list(scheduler.lookups),
        pulling=sorted(scheduler.pulling),
        reads_in_flight=list(puller._reads) if puller else [],
        handshakes_in_flight=list(puller._handshakes) if puller else [],
        lender_held=list(lender.held) if lender else [],
    )


def _multi(scheduler: Any, worker: Any) -> list[str]:
    return _nonempty(
        loads=list(scheduler.loads),
        serving=list(scheduler.serving),
        routes=list(worker.routes),
        failed_blocks=worker.failed_blocks,
        extra_saves=worker.extra_saves,
        loads_held_back=worker.held,
        loads_reported_by_some_ranks=list(scheduler.load_reports.pending()),
    )


def knows_peer(llm: Any, peer_engine_id: str) -> bool:
    """Whether the decode side holds a NIXL connection to that prefill engine."""
    worker_half = worker_connector(llm)
    cores = [c.connector for c in getattr(worker_half, "children", [])] or [worker_half]
    pullers = [c.worker.puller for c in cores if type(c).__name__ == "P2PCore"]
    return any(key[2] == peer_engine_id for puller in pullers for key in puller._peers)
