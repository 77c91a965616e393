"""Drives an in-process engine for the matrix: requests with our ids, aborts, settling, faults."""

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvscope.harness.engine_state import scheduler_connector
from kvscope.verify.driver import Batch, run, settle  # noqa: F401 (imported from here too)


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
    assert offload is not None and not offload.stores.in_flight, (
        "stores still in flight after settling"
    )
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
            from kvscope.harness.engine import in_process_llm

            self._context = in_process_llm(self.model, self.make(policy), **self.overrides)
            self.llm, self.policy = self._context.__enter__(), policy
        return self.llm

    def close(self) -> None:
        if self._context is not None:
            context, self._context, self.llm, self.policy = self._context, None, None, None
            context.__exit__(None, None, None)


SMALL_ENGINE = {"num_gpu_blocks_override": 24, "max_model_len": 512}
"""24 blocks of 32 tokens: room for two of the preemption cell's requests at a time."""
