"""The block state keeps KV cache groups apart and names them (vLLM's hybrid KV cache manager)."""

import time
import uuid

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from kvscope.connector.cpu_offload.span_attributes import blocks_attributes
from kvscope.traces import names

from ..story import MS, Process

pytestmark = pytest.mark.timeout(60)


def _blocks(backend, **params) -> list[dict]:
    with backend.client() as client:
        response = client.get("/api/v1/blocks", params=params)
        assert response.status_code == 200, response.text
        return response.json()["items"]


def _hook_with_event(process: Process, event: str, at_ns: int, attributes: dict) -> None:
    process.hook(
        "update_connector_output", None, at_ns, at_ns + 10, [(event, at_ns + 5, attributes)]
    )


def test_the_same_device_block_id_in_two_groups_is_two_blocks(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    worker = Process("w", engine_id, "worker")
    t0 = time.time_ns()
    # Block id 4 exists in group 0 (full attention) and in group 1 (sliding window).
    loaded = {
        names.BLOCK_TIER: "device",
        names.BLOCK_IDS: [4, 5, 4],
        names.KV_CACHE_GROUP_IDS: [0, 0, 1],
        names.REQUEST_ID: "req-g",
    }
    _hook_with_event(worker, names.EVENT_BLOCK_LOADED, t0, loaded)
    assert backend.export(worker.spans()) == SpanExportResult.SUCCESS
    blocks = _blocks(backend, engine_id=engine_id)
    assert sorted((b["kv_group"], b["block_id"], b["state"]) for b in blocks) == [
        (0, 4, "loaded"),
        (0, 5, "loaded"),
        (1, 4, "loaded"),
    ]
    only_sliding = _blocks(backend, engine_id=engine_id, kv_group=1)
    assert [(b["kv_group"], b["block_id"]) for b in only_sliding] == [(1, 4)]
    assert len(_blocks(backend, engine_id=engine_id, kv_group=0)) == 2


def test_offload_host_blocks_say_their_group_and_older_spans_mean_group_zero(backend):
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    scheduler = Process("s", engine_id, "scheduler")
    t0 = time.time_ns()
    # The offload connector's own attribute builder, as its scheduler half emits it.
    stored = blocks_attributes([1, 2], [b"\x01" * 32, b"\x02" * 32], [0, 1])
    _hook_with_event(scheduler, names.EVENT_BLOCK_STORED, t0, stored)
    # A span from before groups were named: no group ids at all.
    old = {names.BLOCK_TIER: "host", names.HOST_BLOCK_IDS: [3]}
    _hook_with_event(scheduler, names.EVENT_BLOCK_STORED, t0 + MS, old)
    evicted = blocks_attributes([2], [b"\x02" * 32], [1])
    _hook_with_event(scheduler, names.EVENT_BLOCK_EVICTED, t0 + 2 * MS, evicted)
    assert backend.export(scheduler.spans()) == SpanExportResult.SUCCESS
    blocks = _blocks(backend, engine_id=engine_id, tier="host")
    assert sorted((b["block_id"], b["kv_group"], b["state"]) for b in blocks) == [
        (1, 0, "stored"),
        (2, 1, "evicted"),
        (3, 0, "stored"),
    ]
    assert {b["block_id"] for b in _blocks(backend, engine_id=engine_id, kv_group=0)} == {1, 3}
