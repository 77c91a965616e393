"""What an idle engine still holds, on every rank and in whichever process its scheduler runs."""

import time
from pathlib import Path
from typing import Any

from kvscope.harness.engine_state import (
    engine_scheduler,
    leaked_device_blocks,
    scheduler_connector,
    worker_leaks,
)
from kvscope.traces import names
from kvscope.traces.sdk.otlp_json import read_spans_file


def engine_leaks(llm: Any, spans_file: Path | None = None) -> list[str]:
    """Every leak in words; empty when the engine holds nothing.

    Worker halves are asked on every rank (collective_rpc). The scheduler half is read directly
    when it runs in this process; under vLLM's default executor it runs in the engine-core
    process, and then vLLM's own state and the spans that process wrote must show nothing held.
    """
    problems = worker_side(llm)
    if in_process(llm):
        return problems + scheduler_side(llm)
    assert spans_file is not None, "a scheduler in another process is checked from its spans"
    return problems + vllm_side(llm) + open_leases(spans_file)


def in_process(llm: Any) -> bool:
    """Whether the engine core (the scheduler) runs in this process."""
    return hasattr(llm.llm_engine.engine_core, "engine_core")


def worker_side(llm: Any) -> list[str]:
    ranks = llm.collective_rpc(worker_leaks, timeout=60)
    return [f"rank {rank}: {problem}" for rank, found in enumerate(ranks) for problem in found]


def vllm_side(llm: Any) -> list[str]:
    from tests.topology.runs import counter

    problems = []
    if not llm.reset_prefix_cache():  # vLLM refuses while any KV block is still allocated
        problems.append("vLLM: KV blocks still allocated (prefix cache reset refused)")
    if running := counter(llm, "vllm:num_requests_running"):
        problems.append(f"vLLM: {running} requests running")
    return problems


def open_leases(spans_file: Path, wait_s: float = 5.0) -> list[str]:
    """Leases the spans show acquired and never released (nor expired), per process."""
    deadline = time.monotonic() + wait_s  # spans reach the file every OTEL_BSP_SCHEDULE_DELAY
    while True:
        acquired, ended = _lease_events(read_spans_file(spans_file) if spans_file.exists() else [])
        still = sorted(acquired - ended)
        if not still or time.monotonic() > deadline:
            return [f"spans: lease {lease} acquired, never released" for lease in still]
        time.sleep(0.3)


def _lease_events(spans: list[dict]) -> tuple[set, set]:
    ends = (names.EVENT_LEASE_RELEASED, names.EVENT_LEASE_EXPIRED)
    acquired, ended = set(), set()
    for span in spans:
        origin = span["attributes"].get("kvscope.seq.origin")
        for event in span["events"]:
            if names.LEASE_ID not in event:
                continue
            key = (origin, event[names.LEASE_ID])
            if event["name"] == names.EVENT_LEASE_ACQUIRED:
                acquired.add(key)
            elif event["name"] in ends:
                ended.add(key)
    return acquired, ended


def scheduler_side(llm: Any) -> list[str]:
    """The in-process scheduler: vLLM's blocks and requests, and every connector core's state."""
    problems = []
    if device := leaked_device_blocks(llm):
        problems.append(f"vLLM: {device} KV blocks still allocated")
    if requests := list(engine_scheduler(llm).requests):
        problems.append(f"vLLM: requests still tracked {requests}")
    connector = scheduler_connector(llm)
    cores = [(type(connector).__name__, connector)]
    cores += [(child.name, child.connector) for child in getattr(connector, "children", [])]
    for name, core in cores:
        held = _scheduler_core_state(core)
        problems += [f"{name}: {what} = {value!r}" for what, value in held.items() if value]
    return problems


def _scheduler_core_state(core: Any) -> dict[str, Any]:
    kind, half = type(core).__name__, getattr(core, "scheduler", None)
    if kind == "CpuOffloadCore":
        return {
            "active_leases": [lease.lease_id for lease in half.leases.active()],
            "pinned_host_blocks": half.pool.stats().pinned,
            "tracked_requests": list(half.requests),
            "stores_in_flight": half._stores,
            "expired_in_flight": half.expired_leases_in_flight(),
            "stores_reported_by_some_ranks": list(half.store_reports.pending()),
            "loads_reported_by_some_ranks": list(half.load_reports.pending()),
        }
    if kind == "P2PCore":
        return {
            "held_for_readers": list(half.held_for_readers),
            "lookups": list(half.lookups),
            "pulling": sorted(half.pulling),
        }
    if kind == "MultiCore":
        return {"loads": list(half.loads), "serving": list(half.serving)}
    return {}
