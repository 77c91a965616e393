"""The soak's requests, drawn up front from a seeded RNG: prompt, length, route, abort."""

import random
from dataclasses import dataclass

from kvscope.demo.workload import make_prompt

MAX_TOKENS_CHOICES = (8, 16, 32)
REFERENCE_MAX_TOKENS = max(MAX_TOKENS_CHOICES)
ROUTES = ("proxy", "proxy", "decode")
"""Two thirds P/D through the proxy; a third straight to decode, where the offload pool serves
prefixes it has seen (the demo's mix)."""


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    prompt: str
    max_tokens: int
    route: str  # "proxy" or "decode"
    stream: bool
    # The client disconnects once it has this many tokens (streamed), before the last one: a
    # delay would not do, as the servers got fast enough to finish first.
    abort_after_tokens: int | None


def make_plan(num_requests: int, seed: int, abort_fraction: float) -> list[PlannedRequest]:
    """The same list for the same arguments (prompts share the demo's 16 documents)."""
    rng = random.Random(seed)
    plan = []
    for index in range(num_requests):
        prompt = make_prompt(rng)
        abort = rng.random() < abort_fraction
        max_tokens = rng.choice(MAX_TOKENS_CHOICES)
        plan.append(
            PlannedRequest(
                index=index,
                prompt=prompt,
                max_tokens=max_tokens,
                route=ROUTES[index % len(ROUTES)],
                stream=abort or rng.random() < 0.5,
                abort_after_tokens=rng.randint(1, max_tokens - 1) if abort else None,
            )
        )
    return plan


def unique_prompts(plan: list[PlannedRequest]) -> list[str]:
    """Each prompt once, in first-seen order: the reference table's keys."""
    return list(dict.fromkeys(request.prompt for request in plan))
