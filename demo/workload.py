"""The demo's clients: prompts sharing prefixes, long and short, concurrent, at a steady rate."""

import asyncio
import random
import time
from dataclasses import dataclass, field

import httpx

from kvscope.demo.prompts import SENTENCES, long_prompt


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


def make_prompt(rng: random.Random) -> str:
    """A shared document prefix (one of a few, so caches hit) plus a question of its own."""
    document = long_prompt(rng.randrange(4), sentences=rng.choice((2, 4, 8)))
    question = " ".join(rng.choices(SENTENCES, k=rng.randint(0, 2)))
    return f"{document} Question {rng.randrange(10**6)}: {question}"


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
            body = {"model": "kvscope-tiny", "prompt": make_prompt(rng), "temperature": 0,
                    "max_tokens": rng.choice((8, 16, 32))}  # fmt: skip
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
