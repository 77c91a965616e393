"""Drives an in-process engine for the matrix: requests with our ids, aborts, settling, faults."""

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.demo.inspect import engine_scheduler, scheduler_connector

STEP_TIMEOUT_S = 90.0
"""No request of the matrix may take longer: a hang fails the cell instead of the whole run."""


@dataclass
class Finished:
    tokens: list[int]
    finish_reason: str | None
    elapsed_s: float


@dataclass
class Batch:
    """What a batch of requests ended as, by our request id (aborted ones are absent)."""

    results: dict[str, Finished] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    preemptions: int = 0


def request_params(max_tokens: int, kv_transfer_params: dict | None = None) -> Any:
    from vllm import SamplingParams

    extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params else None
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                          extra_args=extra)  # fmt: skip


def run(
    llm: Any,
    req_ids: list[str],
    prompts: list[str],
    max_tokens: int,
    kv_params: list[dict] | None = None,
    abort_when: Callable[[], list[str]] | None = None,
) -> Batch:
    """Adds the requests, steps until each finished; abort_when() (asked after every step)
    names requests to abort now. Counts vLLM's preemptions meanwhile."""
    engine, batch = llm.llm_engine, Batch()
    added: dict[str, float] = {}
    for i, (req_id, prompt) in enumerate(zip(req_ids, prompts, strict=True)):
        engine.add_request(req_id, prompt, request_params(max_tokens, kv_params and kv_params[i]))
        added[req_id] = time.monotonic()
    with count_preemptions(llm) as preemptions:
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while set(added) - set(batch.results) - set(batch.aborted):
            if time.monotonic() > deadline:
                engine.abort_request(list(added))
                raise TimeoutError(f"requests unfinished after {STEP_TIMEOUT_S} s: {batch}")
            for output in engine.step():
                if output.finished:
                    completion = output.outputs[0]
                    batch.results[output.request_id] = Finished(
                        list(completion.token_ids), completion.finish_reason,
                        time.monotonic() - added[output.request_id])  # fmt: skip
            for req_id in abort_when() if abort_when else ():
                engine.abort_request([req_id])
                batch.aborted.append(req_id)
    batch.preemptions = preemptions[0]
    return batch


class count_preemptions:
    """Counts the scheduler's preemptions (vLLM's own method, wrapped, still called)."""

    def __init__(self, llm: Any) -> None:
        self.scheduler = engine_scheduler(llm)
        self.count = [0]

    def __enter__(self) -> list[int]:
        original = self.original = self.scheduler._preempt_request

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count[0] += 1
            return original(*args, **kwargs)

        self.scheduler._preempt_request = counted
        return self.count

    def __exit__(self, *exc_info: object) -> None:
        del self.scheduler._preempt_request  # the class's method again


def settle(llm: Any, timeout_s: float = 30.0) -> None:
    """Steps the idle engine until no finished request still holds blocks (delayed frees,
    stores, reads in flight) or timeout_s passes; the leak checks then say what is left."""
    scheduler = engine_scheduler(llm)
    deadline = time.monotonic() + timeout_s
    while scheduler.has_requests() and time.monotonic() < deadline:
        llm.llm_engine.step()
        time.sleep(0.005)
    for _ in range(3):  # stores commit a step after their copy ended
        llm.llm_engine.step()


def connector_core(llm: Any, kind: str) -> Any | None:
    """The scheduler-side core of that class name, alone or as a Multi's child."""
    connector = scheduler_connector(llm)
    children = [child.connector for child in getattr(connector, "children", [])] or [connector]
    return next((core for core in children if type(core).__name__ == kind), None)


def offload_scheduler(llm: Any) -> Any | None:
    """The CPU offload scheduler half, alone or as a Multi's child; None if there is none."""
    core = connector_core(llm, "CpuOffloadCore")
    return core.scheduler if core is not None else None


def store_then_forget(llm: Any, prompts: list[str], tag: str, max_tokens: int) -> None:
    """Runs the prompts so the offload pool stores them, then empties vLLM's prefix cache:
    from here on only the pool can serve these prefixes."""
    run(llm, [f"{tag}-{i}" for i in range(len(prompts))], prompts, max_tokens)
    settle(llm)
    offload = offload_scheduler(llm)
    assert offload is not None and not offload._stores, "stores still in flight after settling"
    assert llm.reset_prefix_cache(), "vLLM refused to reset its prefix cache (blocks in use)"


def set_faults(path: Path, plan: dict) -> None:
    """The offload connector re-reads this file on its next load: a runtime fault change."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan))
    tmp.replace(path)  # atomic: a connector never reads half a file


class EngineSlot:
    """One in-process engine at a time (vLLM keeps per-process globals): asking for another
    policy shuts the current engine down first. make(policy) is its kv_transfer_config."""

    def __init__(self, model: Path, make: Callable[[str], dict], **overrides: Any) -> None:
        self.model, self.make, self.overrides = model, make, overrides
        self.policy: str | None = None
        self._context: Any = None
        self.llm: Any = None

    def get(self, policy: str) -> Any:
        if policy != self.policy:
            self.close()
            from kvscope.demo.engine import in_process_llm

            self._context = in_process_llm(self.model, self.make(policy), **self.overrides)
            self.llm, self.policy = self._context.__enter__(), policy
        return self.llm

    def close(self) -> None:
        if self._context is not None:
            context, self._context, self.llm, self.policy = self._context, None, None, None
            context.__exit__(None, None, None)


SMALL_ENGINE = {"num_gpu_blocks_override": 24, "max_model_len": 512}
"""24 blocks of 32 tokens: room for two of the preemption cell's requests at a time."""
