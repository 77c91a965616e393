"""The one step loop of the engine tests: step an idle in-process engine until a condition holds."""

import time
from collections.abc import Callable
from typing import Any


def step_until(
    llm: Any,
    done: Callable[[], bool],
    timeout_s: float = 30.0,
    still: Callable[[], object] = lambda: "",
    pause_s: float = 0.0,
) -> None:
    """Steps llm's engine until done() holds; after timeout_s fails with what still() says.

    An in-process engine steps only when asked: after generate() returns, stores commit, copies
    that timed out leave their queue and vLLM frees blocks only in later steps."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done after {timeout_s} s of steps: {still()}")
        llm.llm_engine.step()
        if pause_s:
            time.sleep(pause_s)


def step_until_prefix_cache_reset(llm: Any, timeout_s: float = 30.0) -> None:
    """vLLM's prefix cache emptied: it refuses while a connector still holds finished requests'
    blocks for their stores, so step until it agrees."""
    step_until(llm, llm.reset_prefix_cache, timeout_s, lambda: "blocks still held")
