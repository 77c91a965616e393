"""Drives an in-process vLLM engine: requests with our ids, aborts, preemption count, settling."""

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvscope.harness.engine_state import engine_scheduler

STEP_TIMEOUT_S = 90.0
"""No batch may take longer: a hang fails its scenario instead of the whole run."""


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """os.environ with these values for a while (the whole process shares it)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, extra_args=extra)


FIRST_TOKEN_ID = 10
"""Scenario token ids start here: below are the special tokens of small vocabularies."""


def as_prompt(prompt: str | dict | Sequence[int], vocab_size: int | None = None) -> Any:
    """Text and vLLM prompt dicts as they are; token ids as vLLM's TokensPrompt, folded into the
    model's vocabulary (the scenarios draw ids below 2000; a smaller model would refuse them)."""
    if isinstance(prompt, (str, dict)):
        return prompt
    return {"prompt_token_ids": in_vocabulary(prompt, vocab_size)}


def in_vocabulary(token_ids: Sequence[int], vocab_size: int | None) -> list[int]:
    """The ids, each at or past vocab_size folded into [FIRST_TOKEN_ID, vocab_size): a function
    of the id alone, so prompts that share a prefix still share it."""
    if vocab_size is None or vocab_size <= FIRST_TOKEN_ID:
        return list(token_ids)
    span = vocab_size - FIRST_TOKEN_ID
    return [
        t if t < vocab_size else FIRST_TOKEN_ID + (t - FIRST_TOKEN_ID) % span for t in token_ids
    ]


def vocab_size(llm: Any) -> int:
    """How many token ids the engine's model embeds."""
    return llm.llm_engine.model_config.get_vocab_size()


def add_requests(
    llm: Any,
    req_ids: list[str],
    prompts: Sequence,
    max_tokens: int,
    kv_params: list[dict] | None = None,
) -> dict[str, float]:
    """Adds the requests; returns when each was added, by id."""
    added: dict[str, float] = {}
    vocab = vocab_size(llm)
    for i, (req_id, prompt) in enumerate(zip(req_ids, prompts, strict=True)):
        params = request_params(max_tokens, kv_params[i] if kv_params else None)
        llm.llm_engine.add_request(req_id, as_prompt(prompt, vocab), params)
        added[req_id] = time.monotonic()
    return added


def run(
    llm: Any,
    req_ids: list[str],
    prompts: Sequence,
    max_tokens: int,
    kv_params: list[dict] | None = None,
    abort_when: Callable[[], list[str]] | None = None,
) -> Batch:
    """Adds the requests, steps until each finished; abort_when() (asked after every step)
    names requests to abort now. Counts vLLM's preemptions meanwhile."""
    engine, batch = llm.llm_engine, Batch()
    added = add_requests(llm, req_ids, prompts, max_tokens, kv_params)
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
                        list(completion.token_ids),
                        completion.finish_reason,
                        time.monotonic() - added[output.request_id],
                    )
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


def settle(llm: Any, timeout_s: float = 30.0) -> bool:
    """Steps the idle engine until no finished request still holds blocks (delayed frees,
    stores, reads in flight) or timeout_s passes; the leak checks then say what is left.
    Returns whether the scheduler let go of every request."""
    scheduler = engine_scheduler(llm)
    deadline = time.monotonic() + timeout_s
    while scheduler.has_requests() and time.monotonic() < deadline:
        llm.llm_engine.step()
        time.sleep(0.005)
    for _ in range(3):  # stores commit a step after their copy ended
        llm.llm_engine.step()
    return not scheduler.has_requests()


def reset_prefix_cache(llm: Any, reset_connector: bool = False, timeout_s: float = 10.0) -> bool:
    """vLLM's prefix cache emptied; it refuses while a connector still holds finished requests'
    blocks, so step and retry until it agrees or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache(reset_connector=reset_connector):
        if time.monotonic() > deadline:
            return False
        llm.llm_engine.step()
        time.sleep(0.02)
    return True
