"""The faults of the matrix as scenarios on a live engine; each returns the measured batch."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.harness.backend_process import BackendProcess
from tests.reliability.cases import Case
from tests.reliability.engine_ops import (
    Batch,
    offload_scheduler,
    run,
    set_faults,
    store_then_forget,
)
from tests.reliability.record import BACKEND_DOWN_EXPORT_TIMEOUT_S, EXPORT_TIMEOUT_S


@dataclass
class Cell:
    """One cell's case and the live parts it runs on."""

    case: Case
    llm: Any
    backend: BackendProcess
    recorder: Any = None  # the Recorder: its export queue and retry time can be shrunk
    faults_path: Path | None = None  # the offload connector's runtime fault plan
    peer: Any = None  # PrefillPeer serving P2P reads
    victim: Any = None  # the PrefillPeer that peer_killed cells kill
    notes: dict = field(default_factory=dict)

    def ids(self, tag: str = "") -> list[str]:
        return [f"{self.case.id}{tag}-{i}" for i in range(self.case.num_prompts)]

    def run(self, **kwargs: Any) -> Batch:
        return run(self.llm, self.ids(), self.case.prompts(), self.case.max_tokens, **kwargs)

    def store_then_forget(self) -> None:
        store_then_forget(self.llm, self.case.prompts(), f"{self.case.id}-store", 4)

    def with_faults(self, plan: dict, body: Callable[[], Batch]) -> Batch:
        set_faults(self.faults_path, plan)
        try:
            return body()
        finally:
            set_faults(self.faults_path, {})


# --- the offload pool serves the prompts, under a fault plan --------------------------------


def offload_load_fails(cell: Cell) -> Batch:
    cell.store_then_forget()
    return cell.with_faults({"fail_load_every": 1}, cell.run)


def offload_load_slow(cell: Cell) -> Batch:
    """Loads delayed 5 s against a 1.5 s load timeout: cancelled, reported failed."""
    cell.store_then_forget()
    return cell.with_faults({"load_delay_ms": 5000.0}, cell.run)


def offload_lease_expires(cell: Cell) -> Batch:
    """Leases of 1 ms, loads of at least 300 ms: every lease runs out during its load."""
    cell.store_then_forget()
    batch = cell.with_faults({"lease_timeout_ms": 1.0, "load_delay_ms": 300.0}, cell.run)
    assert offload_scheduler(cell.llm).leases.counters().expired >= cell.case.num_prompts
    return batch


def offload_aborted(cell: Cell) -> Batch:
    """The first request is aborted while its (slowed) load from the pool is in flight."""
    cell.store_then_forget()
    offload = offload_scheduler(cell.llm)
    first = cell.ids()[0] + "-"

    def first_is_loading() -> bool:
        return any(
            state.loading and str(state.request.request_id).startswith(first)
            for state in offload.requests.values()
        )

    return cell.with_faults({"load_delay_ms": 600.0}, lambda: abort_once(cell, first_is_loading))


def abort_once(cell: Cell, ready: Callable[[], bool], kv_params: list | None = None) -> Batch:
    """Runs the cell's requests and aborts the first one as soon as ready() says so."""
    first, done = cell.ids()[0], []

    def abort_when() -> list[str]:
        if done or not ready():
            return []
        done.append(first)
        return [first]

    return cell.run(abort_when=abort_when, kv_params=kv_params)


def preempted(cell: Cell, kv_params: list[dict] | None = None) -> Batch:
    """Long requests outgrow the 24 KV blocks while decoding: vLLM preempts and resumes them."""
    return cell.run(kv_params=kv_params)


# --- the span pipeline fails; the engine must not notice ----------------------------------


def backend_down(cell: Cell, workload: Callable[[], Batch]) -> Batch:
    """The backend process is stopped for the whole workload, then started again."""
    from kvscope.traces.sdk.configure import flush

    cell.backend.stop()
    try:
        with cell.recorder.export_timeout_limited(BACKEND_DOWN_EXPORT_TIMEOUT_S):
            batch = workload()
            flush(timeout_s=EXPORT_TIMEOUT_S)  # exports fail now (refused), and are counted
    finally:
        cell.backend.restart()
    return batch


QUEUE_FULL_BOUND = 64
"""The export queue's bound during queue_full cells: a workload round overflows it."""


def queue_full(cell: Cell, workload: Callable[[], Batch]) -> Batch:
    """The backend is stopped (SIGSTOP) while spans pile up behind its blocked export."""
    from kvscope.traces.sdk.configure import export_counters

    before = export_counters().dropped_queue_full
    cell.backend.pause()
    try:
        with cell.recorder.export_queue_limited(QUEUE_FULL_BOUND):
            batch = workload()
            for _ in range(10):  # more work until the bounded queue overflows
                if export_counters().dropped_queue_full > before:
                    break
                workload()
    finally:
        cell.backend.resume()
    return batch
