"""Workloads for the topology tests: store-then-hit passes, P/D pulls, vLLM's own counters."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvscope.harness.oracle import greedy_tokens
from kvscope.verify.driver import environ  # noqa: F401 (the topology tests take it from here)

MAX_TOKENS = 8
ONE_TOKEN_PROMPT = "Hi"  # under one block: stores nothing, hits nothing, steps the engine


def counter(llm: Any, name: str, **labels: str) -> float:
    """A vLLM counter summed over engines (the Prometheus registry is per process, so take
    differences around one engine's work when two engines share the process)."""
    return sum(
        metric.value
        for metric in llm.get_metrics()
        if metric.name == name and all(metric.labels.get(k) == v for k, v in labels.items())
    )


def step_once(llm: Any) -> None:
    """A one-token request: an idle in-process engine steps only when given work."""
    greedy_tokens(llm, [ONE_TOKEN_PROMPT], 1)


def settle(llm: Any, leaks: Callable[[], list[str]], timeout_s: float = 30) -> list[str]:
    """leaks() once it is empty, stepping the engine in between, or what it still says."""
    deadline = time.monotonic() + timeout_s
    while (found := leaks()) and time.monotonic() < deadline:
        step_once(llm)
        time.sleep(0.2)
    return found


@dataclass
class Passes:
    """Store on the first pass; the second, after a prefix cache reset, is served by hits."""

    first: list[list[int]]
    second: list[list[int]]
    external_hits: float
    leaks: list[str] = field(default_factory=list)


def reset_prefix_cache(llm: Any, timeout_s: float = 30) -> None:
    """vLLM's prefix cache emptied; it refuses while finished requests' stores hold blocks."""
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache():
        assert time.monotonic() < deadline, "the prefix cache never reset: blocks still held"
        step_once(llm)


def store_then_hit(llm: Any, prompts: list[str]) -> Passes:
    first = greedy_tokens(llm, prompts, MAX_TOKENS)
    reset_prefix_cache(llm)
    before = counter(llm, "vllm:external_prefix_cache_hits")
    second = greedy_tokens(llm, prompts, MAX_TOKENS)
    return Passes(first, second, counter(llm, "vllm:external_prefix_cache_hits") - before)


def prefill(llm: Any, prompts: list[str]) -> tuple[list[dict], list[int]]:
    """kv_transfer_params per prompt (what a proxy forwards) and each prompt's length."""
    from vllm import SamplingParams

    remote = {"kv_transfer_params": {"do_remote_decode": True}}
    params = SamplingParams(temperature=0.0, max_tokens=1, extra_args=remote)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [out.kv_transfer_params for out in outputs], [len(o.prompt_token_ids) for o in outputs]


def decode(llm: Any, prompts: list[str], transfer: list[dict]) -> list[list[int]]:
    """Greedy tokens of each prompt, its KV pulled from where transfer says."""
    from vllm import SamplingParams

    params = [
        SamplingParams(
            temperature=0.0,
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            extra_args={"kv_transfer_params": t},
        )
        for t in transfer
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


@dataclass
class Pulls:
    tokens: list[list[int]]
    prompt_lengths: list[int]
    external_hits: float
    p2p_hits: float  # vLLM's prompt_tokens_cached_by_source{source="p2p"}
    decode_stats: list[dict] = field(default_factory=list)  # per rank
    leaks: list[str] = field(default_factory=list)


def prefill_then_decode(prefill_llm: Any, decode_llm: Any, prompts: list[str]) -> Pulls:
    from kvscope.harness.engine_state import worker_stats

    transfer, lengths = prefill(prefill_llm, prompts)
    assert all(transfer), f"the prefill engine returned no kv_transfer_params: {transfer}"
    hits, p2p = "vllm:external_prefix_cache_hits", "vllm:prompt_tokens_cached_by_source"
    before = counter(decode_llm, hits), counter(decode_llm, p2p, source="p2p")
    tokens = decode(decode_llm, prompts, transfer)
    pulls = Pulls(
        tokens,
        lengths,
        counter(decode_llm, hits) - before[0],
        counter(decode_llm, p2p, source="p2p") - before[1],
    )
    pulls.decode_stats = decode_llm.collective_rpc(worker_stats, timeout=60)
    return pulls
