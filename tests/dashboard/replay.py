"""Test data: a real CPU offload recording replayed as if it just happened, plus story spans.

data/cpu_offload_spans.jsonl.gz was recorded with KVSCOPE_TRACES_FILE set while
`python -m kvscope.demo.run_prompts` ran the tiny model through CpuOffloadConnector with
faults {"fail_load_every": 3}, two prompts, three passes: six requests, loads from the host
pool, one injected load failure recomputed. That connector emits no block events a backend
sees yet, so the block map is fed from story spans (tests/backend/story.py) instead.
"""

import gzip
import json
import time
from pathlib import Path

import httpx

from kvscope.traces import names
from tests.backend.story import MS, Process

RECORDING = Path(__file__).with_name("data") / "cpu_offload_spans.jsonl.gz"
_TIME_KEYS = ("startTimeUnixNano", "endTimeUnixNano", "timeUnixNano")


def recorded_batches(end_ns: int | None = None) -> list[dict]:
    """The recording's OTLP/JSON requests, shifted so that its last span ends at end_ns."""
    with gzip.open(RECORDING, "rt") as lines:
        batches = [json.loads(line) for line in lines if line.strip()]
    last = max(int(span["endTimeUnixNano"]) for span in _spans(batches))
    shift = (end_ns or time.time_ns()) - last
    for span in _spans(batches):
        _shift(span, shift)
        for event in span.get("events", []):
            _shift(event, shift)
    return batches


def _spans(batches: list[dict]):
    for batch in batches:
        for resource_spans in batch["resourceSpans"]:
            for scope_spans in resource_spans["scopeSpans"]:
                yield from scope_spans["spans"]


def _shift(item: dict, shift: int) -> None:
    for key in _TIME_KEYS:
        if key in item:
            item[key] = str(int(item[key]) + shift)


def post_recording(url: str, token: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url, timeout=10, headers=headers) as client:
        for batch in recorded_batches():
            client.post("/v1/traces", json=batch).raise_for_status()


def block_pool_spans(engine_id: str = "engine-pool", blocks: int = 3000) -> list:
    """A host pool of `blocks` stored blocks, a tenth of them evicted, one lease held for an
    hour and one past its expiry (no end seen): the block map at scale and lease states."""
    scheduler = Process("kvscope-scheduler", engine_id, "scheduler")
    t0 = time.time_ns() - 10_000 * MS
    chunks = [list(range(lo, min(lo + 1000, blocks))) for lo in range(0, blocks, 1000)]
    stored = [
        (names.EVENT_BLOCK_STORED, t0 + i, {names.BLOCK_TIER: "host", names.HOST_BLOCK_IDS: ids})
        for i, ids in enumerate(chunks)
    ]
    evicted = list(range(0, blocks, 10))[:1000]
    gone = (
        names.EVENT_BLOCK_EVICTED,
        t0 + MS,
        {names.BLOCK_TIER: "host", names.HOST_BLOCK_IDS: evicted},
    )
    scheduler.hook("update_connector_output", None, t0, t0 + 2 * MS, events=stored + [gone])
    for lease_id, holder, host_ids, timeout_s in (
        ("held-1", "req-held", [1, 2, 3], 3600.0),
        ("late-1", "req-late", [5, 6], 1.0),
    ):
        acquired = (
            names.EVENT_LEASE_ACQUIRED,
            t0 + 3 * MS,
            {
                names.LEASE_ID: lease_id,
                names.LEASE_HOLDER: holder,
                names.HOST_BLOCK_IDS: host_ids,
                names.LEASE_TIMEOUT_S: timeout_s,
            },
        )
        scheduler.hook(
            "get_num_new_matched_tokens",
            None,
            t0 + 3 * MS,
            t0 + 4 * MS,
            events=[acquired],
            **{names.REQUEST_ID: holder, names.TOKENS_EXTERNAL_HIT: 16 * len(host_ids)},
        )
    return scheduler.spans()
