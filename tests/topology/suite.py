"""The runs both topology modules make, one engine (or P/D pair) at a time, recorded."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.harness.engine import in_process_llm
from kvscope.harness.engine_state import worker_stats
from tests.topology.configs import multi_config, p2p_config
from tests.topology.leaks import engine_leaks, in_process
from tests.topology.runs import (
    Passes,
    Pulls,
    prefill_then_decode,
    reset_prefix_cache,
    settle,
    store_then_hit,
)


@dataclass
class Topology:
    """How an engine ran: vLLM's executor, where its scheduler ran, how many ranks."""

    executor: str
    scheduler_in_process: bool
    tp_size: int


def topology_of(llm: Any) -> Topology:
    parallel = llm.llm_engine.vllm_config.parallel_config
    return Topology(
        str(parallel.distributed_executor_backend), in_process(llm), parallel.tensor_parallel_size
    )


@dataclass
class AloneRun:
    passes: Passes
    topology: Topology


def run_alone(
    model: Path, config: dict, prompts: list[str], tp_size: int, spans_file: Path | None
) -> AloneRun:
    """One engine with the connector: store, reset vLLM's prefix cache, hit; then its leaks."""
    with in_process_llm(model, config, tensor_parallel_size=tp_size) as llm:
        passes = store_then_hit(llm, prompts)
        passes.leaks = settle(llm, lambda: engine_leaks(llm, spans_file))
        return AloneRun(passes, topology_of(llm))


@dataclass
class PDRun:
    """A P2P prefill engine, and two decode engines pulling from it in turn."""

    p2p: Pulls
    multi: Pulls
    multi_passes: Passes  # the Multi's offload child, after its P/D pulls
    prefill_leaks: list[str] = field(default_factory=list)
    prefill_stats: list[dict] = field(default_factory=list)  # per rank, after both decodes
    topologies: list[Topology] = field(default_factory=list)


def run_pd(model: Path, prompts: list[str], tp_size: int, spans_file: Path | None) -> PDRun:
    with in_process_llm(model, p2p_config(tp_size), tensor_parallel_size=tp_size) as prefill:
        with in_process_llm(model, p2p_config(tp_size), tensor_parallel_size=tp_size) as decode:
            p2p = prefill_then_decode(prefill, decode, prompts)
            p2p.leaks = settle(decode, lambda: engine_leaks(decode, spans_file))
            topologies = [topology_of(prefill), topology_of(decode)]
        with in_process_llm(model, multi_config(tp_size), tensor_parallel_size=tp_size) as multi:
            pulls = prefill_then_decode(prefill, multi, prompts)
            reset_prefix_cache(multi)  # the first pass below computes, so the offload child stores
            passes = store_then_hit(multi, prompts)
            passes.leaks = settle(multi, lambda: engine_leaks(multi, spans_file))
        run = PDRun(p2p, pulls, passes, topologies=topologies)
        run.prefill_leaks = settle(prefill, lambda: engine_leaks(prefill, spans_file))
        run.prefill_stats = prefill.collective_rpc(worker_stats, timeout=60)
        return run
