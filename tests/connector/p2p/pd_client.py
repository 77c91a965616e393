"""Helpers for the P/D engine tests: greedy requests, streamed answers, waiting for no leaks."""

import json
import time
from pathlib import Path

import httpx

from kvscope.bench.pd.pd_pair import metric


def completion_body(model: Path, prompt: str, max_tokens: int, **extra) -> dict:
    return {
        "model": str(model),
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        **extra,
    }


def greedy_via(url: str, body: dict, timeout_s: float = 120) -> list[int]:
    """Generated token ids of a non-streamed completion; raises on an HTTP error."""
    answer = httpx.post(url + "/v1/completions", json=body, timeout=timeout_s)
    answer.raise_for_status()
    return list(answer.json()["choices"][0]["token_ids"])


def streamed_chunks(url: str, body: dict, timeout_s: float = 120):
    """Yields each streamed chunk's token ids (a list per chunk) as it arrives."""
    with httpx.stream(
        "POST", url + "/v1/completions", json={**body, "stream": True}, timeout=timeout_s
    ) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choice = json.loads(line[6:])["choices"]
                if choice:
                    yield list(choice[0].get("token_ids") or [])


def prefill_only(prefill_url: str, body: dict) -> dict:
    """What the proxy's first leg returns: the decode side's kv_transfer_params."""
    leg = {**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    answer = httpx.post(prefill_url + "/v1/completions", json=leg, timeout=120)
    answer.raise_for_status()
    return answer.json()["kv_transfer_params"]


def wait_until_no_blocks_held(urls: list[str], timeout_s: float) -> float:
    """Seconds until every server holds no KV blocks and runs no request; fails after timeout_s."""
    start = time.monotonic()
    while True:
        held = {url: metric(url, "vllm:kv_cache_usage_perc") for url in urls}
        busy = {url: metric(url, "vllm:num_requests_running") for url in urls}
        if not any(held.values()) and not any(busy.values()):
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"blocks still held after {timeout_s} s: {held}, running {busy}")
        time.sleep(0.5)
