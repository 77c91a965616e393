"""The one leak checker: what an idle engine still holds, from vLLM's own state and each kvscope
connector half's held(), on every rank and in whichever process its scheduler runs."""

import time
from pathlib import Path
from typing import Any

from kvscope.harness.engine_state import connector_cores, engine_scheduler, leaked_device_blocks

SETTLE_S = 5.0
"""How long held() may take to read all falsy: a cancelled copy leaves the copy thread's queue
only when that thread next runs (seconds on a loaded 2-core machine)."""
POLL_S = 0.02


def engine_leaks(llm: Any, spans_file: Path | None = None, settle_s: float = SETTLE_S) -> list[str]:
    """Every leak of an idle engine, in words; empty when it holds nothing.

    Worker halves are asked on every rank (llm.collective_rpc). A scheduler in this process is
    read directly: vLLM's block pool and request table, and each connector core's held(). Under
    vLLM's default executor it runs in the engine-core process; then vLLM's own view (a prefix
    cache reset it refuses, requests running) and the leases that process's spans (spans_file)
    show acquired and never ended must show nothing held.
    """
    ranks = llm.collective_rpc(worker_leaks, timeout=60 + settle_s, args=(settle_s,))
    problems = [f"rank {rank}: {problem}" for rank, found in enumerate(ranks) for problem in found]
    if scheduler_in_process(llm):
        return problems + vllm_leaks(llm) + settled_held(engine_scheduler(llm).connector, settle_s)
    if spans_file is None:
        raise ValueError(
            "this engine's scheduler runs in vLLM's engine-core process, out of reach: pass the "
            "spans_file that process writes (KVSCOPE_TRACES_FILE) so its leases can be checked"
        )
    return problems + vllm_leaks_from_outside(llm) + open_leases(spans_file)


def scheduler_in_process(llm: Any) -> bool:
    """Whether the engine core (the scheduler) runs in this process."""
    return hasattr(llm.llm_engine.engine_core, "engine_core")


def vllm_leaks(llm: Any) -> list[str]:
    """vLLM's own state of an in-process scheduler: KV blocks allocated, requests tracked."""
    problems = []
    if device := leaked_device_blocks(llm):
        problems.append(f"vLLM: {device} KV blocks still allocated")
    if requests := list(engine_scheduler(llm).requests):
        problems.append(f"vLLM: requests still tracked {requests}")
    return problems


def vllm_leaks_from_outside(llm: Any) -> list[str]:
    """vLLM's own state of a scheduler in another process, as its public API tells it."""
    problems = []
    if not llm.reset_prefix_cache():  # vLLM refuses while any KV block is still allocated
        problems.append("vLLM: KV blocks still allocated (prefix cache reset refused)")
    running = sum(m.value for m in llm.get_metrics() if m.name == "vllm:num_requests_running")
    if running:
        problems.append(f"vLLM: {running:g} requests running")
    return problems


def held_now(connector: Any) -> list[str]:
    """What each kvscope core under connector (a Multi's children too) holds, in words."""
    if connector is None:
        return []
    problems = []
    for name, core in connector_cores(connector):
        held = getattr(core, "held", None)
        if callable(held):
            problems += [f"{name}: {what} = {value!r}" for what, value in held().items() if value]
        elif type(core).__module__.startswith("kvscope."):  # ours, so it must say what it holds
            problems.append(f"{name}: has no held(); add one so leaks can be checked")
    return problems


def settled_held(connector: Any, settle_s: float = SETTLE_S) -> list[str]:
    """held_now once it is empty, or what it still says after settle_s: time alone settles a
    copy thread, so this polls and never steps the engine."""
    deadline = time.monotonic() + settle_s
    while (problems := held_now(connector)) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return problems


def worker_leaks(worker: Any = None, settle_s: float = SETTLE_S) -> list[str]:
    """What this rank's worker-side connector still holds, in words; empty when it holds nothing.
    Sent to every rank by llm.collective_rpc (a module function, so it goes by reference)."""
    from vllm.distributed.kv_transfer.kv_transfer_state import (
        get_kv_transfer_group,
        has_kv_transfer_group,
    )

    return settled_held(get_kv_transfer_group() if has_kv_transfer_group() else None, settle_s)


def open_leases(spans_file: Path, wait_s: float = 5.0) -> list[str]:
    """Leases the spans show acquired and never released (nor expired), per process."""
    from kvscope.traces.sdk.otlp_json import read_spans_file

    deadline = time.monotonic() + wait_s  # spans reach the file every OTEL_BSP_SCHEDULE_DELAY
    while True:
        acquired, ended = _lease_events(
            read_spans_file(str(spans_file)) if spans_file.exists() else []
        )
        still = sorted(acquired - ended)
        if not still or time.monotonic() > deadline:
            return [f"spans: lease {lease} acquired, never released" for lease in still]
        time.sleep(0.3)


def _lease_events(spans: list[dict]) -> tuple[set, set]:
    from kvscope.traces import names

    ends = (names.EVENT_LEASE_RELEASED, names.EVENT_LEASE_EXPIRED)
    acquired, ended = set(), set()
    for span in spans:
        origin = span["attributes"].get(names.SEQ_ORIGIN)
        for event in span["events"]:
            if names.LEASE_ID not in event:
                continue
            key = (origin, event[names.LEASE_ID])
            if event["name"] == names.EVENT_LEASE_ACQUIRED:
                acquired.add(key)
            elif event["name"] in ends:
                ended.add(key)
    return acquired, ended
