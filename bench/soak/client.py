"""Sends the planned requests (concurrent, each bounded by a timeout), disconnecting some on
purpose, and records how each one ended and the tokens it got."""

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from kvscope.bench.soak.plan import PlannedRequest

COMPLETED, ABORTED, FAILED, HUNG = "completed", "aborted", "failed", "hung"


@dataclass
class Outcome:
    request: PlannedRequest
    status: str  # COMPLETED, ABORTED (by us), FAILED (an error answer), HUNG (timed out)
    tokens: list[int] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0


class _Failed(Exception):
    """An error answer from the system (HTTP status, error event, finish_reason error)."""


class _Disconnect(Exception):
    """The plan's early disconnect: enough tokens arrived."""


def request_body(request: PlannedRequest) -> dict:
    return {
        "model": "kvscope-tiny",
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": request.stream,
    }


async def send(client: httpx.AsyncClient, url: str, request: PlannedRequest, tokens: list[int]):
    """One completion; appends token ids to `tokens` as they arrive; raises _Failed."""
    body = request_body(request)
    async with client.stream("POST", url + "/v1/completions", json=body) as answer:
        if answer.status_code != 200:
            text = (await answer.aread()).decode(errors="replace")
            raise _Failed(f"HTTP {answer.status_code}: {text[:300]}")
        if not request.stream:
            tokens.extend(_choice(json.loads(await answer.aread())).get("token_ids") or [])
            return
        async for line in answer.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = _choice(json.loads(line[6:]))
                tokens.extend(choice.get("token_ids") or [])
                if request.abort_after_tokens and len(tokens) >= request.abort_after_tokens:
                    raise _Disconnect  # leaves the stream: the connection closes mid-answer


def _choice(chunk: dict) -> dict:
    if "error" in chunk:
        raise _Failed(f"error answer: {json.dumps(chunk['error'])[:300]}")
    choices = chunk.get("choices") or [{}]
    if choices[0].get("finish_reason") == "error":
        raise _Failed("finish_reason error")
    return choices[0]


async def run_one(urls: dict[str, str], request: PlannedRequest, timeout_s: float) -> Outcome:
    """One request on its own connection: httpx can leave a pooled connection checked out
    (CLOSE-WAIT) when a stream is cancelled, which starved a shared pool in a 2000-request soak."""
    # Longer than the per-request bound, so a silent server shows as hung, not as an error.
    timeout = httpx.Timeout(timeout_s + 10.0, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as client:
        return await _run_one(client, urls, request, timeout_s)


async def _run_one(client, urls: dict[str, str], request: PlannedRequest, timeout_s: float):
    tokens: list[int] = []
    started = time.monotonic()
    try:
        await asyncio.wait_for(send(client, urls[request.route], request, tokens), timeout_s)
        status, error = COMPLETED, ""
    except _Disconnect:
        status, error = ABORTED, ""
    except TimeoutError:
        status, error = HUNG, f"no answer in {timeout_s:.0f} s"
    except _Failed as exc:
        status, error = FAILED, str(exc)
    except (httpx.HTTPError, ValueError) as exc:
        status, error = FAILED, f"{type(exc).__name__}: {exc}"[:300]
    return Outcome(request, status, tokens, error, time.monotonic() - started)


async def run_plan(
    urls: dict[str, str],
    plan: list[PlannedRequest],
    concurrency: int,
    timeout_s: float,
    on_done: Callable[[Outcome, int], None],
) -> list[Outcome]:
    """Runs the plan with `concurrency` clients; on_done(outcome, number done) after each."""
    outcomes: list[Outcome] = []
    queue: asyncio.Queue[PlannedRequest] = asyncio.Queue()
    for request in plan:
        queue.put_nowait(request)

    async def worker() -> None:
        while not queue.empty():
            outcome = await run_one(urls, queue.get_nowait(), timeout_s)
            outcomes.append(outcome)
            on_done(outcome, len(outcomes))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sorted(outcomes, key=lambda o: o.request.index)


def counts(outcomes: list[Outcome]) -> Counter:
    return Counter(outcome.status for outcome in outcomes)
