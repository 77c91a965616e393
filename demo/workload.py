"""The demo's clients: prompts sharing prefixes, long and short, concurrent, at a steady rate."""

import asyncio
import random
import time
from dataclasses import dataclass, field

import httpx

from kvscope.harness.prompts import SENTENCES, long_prompt


@dataclass
class WorkloadStats:
    sent: int = 0
    ok: int = 0
    failed: int = 0
    latencies_s: list[float] = field(default_factory=list)

    def line(self) -> str:
        latencies = sorted(self.latencies_s) or [0.0]
        p50 = latencies[len(latencies) // 2]
        return f"requests {self.sent} sent, {self.ok} ok, {self.failed} failed; p50 {p50:.2f} s"


NUM_DOCUMENTS = 16
"""More shared documents than a small KV cache holds: vLLM's prefix cache evicts them and the
offload pool serves them back."""


def document(doc_id: int) -> str:
    """Shared prefix number doc_id: the same text every time it is asked for."""
    rng = random.Random(doc_id)
    return f"Document {doc_id}. " + " ".join(rng.choices(SENTENCES, k=rng.randint(3, 8)))


def make_prompt(rng: random.Random) -> str:
    """A shared document prefix plus, half the time, a longer tail, then a question."""
    prefix = document(rng.randrange(NUM_DOCUMENTS))
    if rng.random() < 0.3:
        prefix += " " + long_prompt(rng.randrange(5), sentences=2)
    return f"{prefix} Question {rng.randrange(10**6)}: {rng.choice(SENTENCES)}"


async def run_workload(
    targets: list[str],
    duration_s: float,
    rate_per_s: float,
    concurrency: int,
    stats: WorkloadStats,
    seed: int = 0,
) -> None:
    """Sends completions to the targets (round robin) until duration_s has passed."""
    rng = random.Random(seed)
    limit = asyncio.Semaphore(concurrency)
    deadline = time.monotonic() + duration_s
    async with httpx.AsyncClient(timeout=120) as client:
        tasks = []
        while time.monotonic() < deadline:
            target = targets[stats.sent % len(targets)]
            body = {
                "model": "kvscope-tiny",
                "prompt": make_prompt(rng),
                "temperature": 0,
                "max_tokens": rng.choice((8, 16, 32)),
            }
            stats.sent += 1
            tasks.append(asyncio.create_task(_one(client, target, body, limit, stats)))
            await asyncio.sleep(rng.expovariate(rate_per_s))
        await asyncio.gather(*tasks)


async def _one(client, target: str, body: dict, limit: asyncio.Semaphore, stats) -> None:
    async with limit:
        start = time.monotonic()
        try:
            response = await client.post(target + "/v1/completions", json=body)
            response.raise_for_status()
            stats.ok += 1
            stats.latencies_s.append(time.monotonic() - start)
        except httpx.HTTPError:
            stats.failed += 1
