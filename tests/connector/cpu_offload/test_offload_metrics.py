"""The offload connector's stats, Prometheus metrics and host-tier KV events, without an engine:
stats through msgpack and vLLM's logger, metrics read back with prometheus_client's parser."""

from types import SimpleNamespace

import msgspec
import pytest
from vllm import SamplingParams
from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.request import Request
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.connector import CpuOffloadConnector
from kvscope.connector.cpu_offload.faults import FaultInjector
from kvscope.connector.cpu_offload.metadata import OffloadWorkerMeta
from kvscope.connector.cpu_offload.scheduler import OffloadScheduler
from kvscope.connector.cpu_offload.stats import (
    MAX_SAMPLES,
    IntervalReporter,
    OffloadStats,
    Samples,
)
from tests.connector.cpu_offload.hma_harness import Engine
from tests.connector.cpu_offload.hma_harness import request as hma_request
from tests.connector.cpu_offload.test_offload_ranks import (
    BLOCK,
    HASHER,
    NAMESPACE,
    request,
    start_load,
    store_prompt,
)
from tests.connector.prom_scrape import exactly, registry_types, scrape_registry

LABELS = {"model_name": "tiny", "engine": "0"}


def scheduler(num_host_blocks: int = 16, world_size: int = 1) -> OffloadScheduler:
    return OffloadScheduler(
        OffloadConfig(),
        NAMESPACE,
        BLOCK,
        num_host_blocks,
        world_size,
        FaultInjector(),
        kv_events=True,
    )


def stored(offload: OffloadScheduler, req_id: str, num_tokens: int = 4 * BLOCK + 5, first=0):
    """A prompt of tokens first, first + 1, ... stored by the only rank."""
    params = SamplingParams(max_tokens=4, temperature=0.0)
    tokens = list(range(first, first + num_tokens))
    req = Request(req_id, tokens, params, None, block_hasher=HASHER)
    for store_id in store_prompt(offload, req):
        offload.on_worker_output(OffloadWorkerMeta(stores_done={store_id: 1}))
    return req


def report(offload: OffloadScheduler, reporter: IntervalReporter) -> OffloadStats:
    counters, gauges = offload.report_values()
    return reporter.report(counters, gauges, offload.samples)


def test_a_store_and_a_load_are_reported_once_as_an_interval():
    offload, reporter = scheduler(), IntervalReporter(OffloadStats)
    stored(offload, "r0")
    start_load(offload, request("r1"))
    offload.on_worker_output(OffloadWorkerMeta(loads_done={"r1": 1}))
    data = report(offload, reporter).data
    assert data["counters"] == {
        "lookups": 2,
        "hit_tokens": 4 * BLOCK,
        "miss_tokens": 4 * BLOCK,
        "stored_blocks": 4,
        "loaded_blocks": 4,
    }
    assert data["gauges"] == {
        "host_blocks": 16,
        "host_blocks_used": 4,
        "host_blocks_pinned": 0,
        "pending_stores": 0,
        "active_leases": 0,
    }
    assert len(data["histograms"]["kv_wait_seconds"]) == 1
    assert report(offload, reporter) is None, "nothing changed: nothing to report"


def test_failures_are_counted_by_cause_and_outcome():
    offload, reporter = scheduler(), IntervalReporter(OffloadStats)
    stored(offload, "r0")
    start_load(offload, request("r1"))
    offload.on_worker_output(OffloadWorkerMeta(loads_failed={"r1": 1}))
    [store_id] = store_prompt(offload, request("r2", 6 * BLOCK + 1))
    offload.on_worker_output(OffloadWorkerMeta(stores_failed={store_id: 1}))
    failures = report(offload, reporter).data["failures"]
    assert failures == {"load_failed": {"recomputed": 1}, "store_failed": {"dropped": 1}}


def test_stats_survive_msgpack_and_vllms_logger_and_stay_bounded():
    samples = Samples()
    for _ in range(MAX_SAMPLES + 10):
        samples.observe("load_seconds", 0.01)
    stats = IntervalReporter(OffloadStats).report({"load_bytes": 4096, "load_s": 0.5}, {}, samples)
    assert stats.data["counters"]["samples_dropped"] == 10
    wire = MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict()))
    rebuilt = CpuOffloadConnector.build_kv_connector_stats(wire)
    rebuilt.aggregate(CpuOffloadConnector.build_kv_connector_stats(wire))
    assert len(rebuilt.data["histograms"]["load_seconds"]) == MAX_SAMPLES
    assert rebuilt.data["counters"]["load_bytes"] == 8192
    assert rebuilt.data["counters"]["samples_dropped"] == 10 + 10 + MAX_SAMPLES
    logging = KVConnectorLogging(None)
    logging.connector_cls = CpuOffloadConnector  # what vLLM's factory finds for the config
    logging.observe(wire)
    lines = []
    logging.log(lambda fmt, *args: lines.append(fmt % args))
    assert "load_gb_per_s=0.0" in lines[0] and "load_bytes=4096" in lines[0]


def test_stats_of_another_version_or_shape_are_refused():
    with pytest.raises(ValueError, match="version 2, expected 1"):
        CpuOffloadConnector.build_kv_connector_stats({"version": 2})
    with pytest.raises(ValueError, match="'counters' must be a dict"):
        CpuOffloadConnector.build_kv_connector_stats(
            {"version": 1, "counters": {"bogus": 1}, "gauges": {}, "histograms": {}, "failures": {}}
        )


def value(found: dict, name: str, **labels: str) -> float:
    return exactly(found, name, **LABELS, **labels)


def test_prometheus_metrics_carry_vllms_labels_and_every_kind_of_value():
    offload, reporter = scheduler(), IntervalReporter(OffloadStats)
    stored(offload, "r0")
    start_load(offload, request("r1"))
    offload.on_worker_output(OffloadWorkerMeta(loads_failed={"r1": 1}))
    samples = Samples()
    samples.observe("store_seconds", 0.002)
    samples.observe("store_size_bytes", 65536)
    worker = IntervalReporter(OffloadStats).report(
        {"store_bytes": 65536, "store_s": 0.002}, {}, samples
    )
    stats = worker.aggregate(report(offload, reporter))  # as vLLM adds the scheduler's
    registry, types = registry_types()
    vllm_config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={}))
    metrics = CpuOffloadConnector.build_prom_metrics(
        vllm_config, types, ["model_name", "engine"], {0: ["tiny", "0"]}
    )
    metrics.observe(MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict())), 0)
    found = scrape_registry(registry)
    assert value(found, "vllm:kvscope_offload_lookups_total") == 2
    assert value(found, "vllm:kvscope_offload_hit_tokens_total") == 4 * BLOCK
    assert value(found, "vllm:kvscope_offload_bytes_total", path="store") == 65536
    assert value(found, "vllm:kvscope_offload_transfer_seconds_count", path="store") == 1
    assert value(found, "vllm:kvscope_offload_transfer_size_bytes_sum", path="store") == 65536
    assert value(found, "vllm:kvscope_offload_host_blocks") == 16
    assert value(found, "vllm:kvscope_offload_host_blocks_used") == 4
    assert (
        value(
            found, "vllm:kvscope_offload_failures_total", cause="load_failed", outcome="recomputed"
        )
        == 1
    )
    assert value(found, "vllm:kvscope_offload_kv_wait_seconds_count") == 1


def decoded(events) -> list:
    """Through vLLM's own wire format, as a ZMQ subscriber gets it."""
    batch = KVEventBatch(ts=0.0, events=list(events))
    return msgspec.msgpack.decode(msgspec.msgpack.encode(batch), type=KVEventBatch).events


def test_committed_blocks_are_announced_with_vllms_hashes_and_evicted_ones_removed():
    offload = scheduler(num_host_blocks=4)
    req = stored(offload, "r0")
    events = decoded(offload.kv_events.take())
    hashes = [maybe_convert_block_hash(h) for h in req.block_hashes[:4]]
    assert [type(e) for e in events] == [BlockStored] * 4
    assert [e.block_hashes[0] for e in events] == hashes
    assert [e.parent_block_hash for e in events] == [None, *hashes[:3]]
    assert {e.medium for e in events} == {"CPU"} and events[1].token_ids == list(range(32, 64))
    stored(offload, "r1", 2 * BLOCK + 1, first=1000)  # another prefix: evicts the oldest two
    later = decoded(offload.kv_events.take())
    assert [type(e) for e in later] == [BlockRemoved, BlockStored, BlockStored]
    assert later[0].block_hashes == hashes[:2] and later[0].medium == "CPU"


def test_no_events_are_kept_when_vllm_publishes_none():
    offload = OffloadScheduler(OffloadConfig(), NAMESPACE, BLOCK, 16, 1, FaultInjector())
    stored(offload, "r0")
    assert offload.kv_events.take() == []


def test_a_worker_reports_its_copies_bytes_and_seconds_once_through_msgpack(tiny_model):
    engine = Engine(tiny_model)
    try:
        engine.add(hma_request("r1", list(range(100, 100 + 6 * BLOCK + 5))))
        engine.run()
        stats = engine.worker.get_kv_connector_stats()
        wire = MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict()))
        data = CpuOffloadConnector.build_kv_connector_stats(wire).data
        worker = engine.worker.inner.worker
        assert data["counters"] == {
            "store_bytes": worker.stats.store_bytes,
            "store_s": worker.stats.store_s,
        }
        assert worker.stats.store_bytes > 0 and worker.stats.load_bytes == 0
        # One store: the prefill fills six blocks; the two decoded tokens fill none.
        assert len(data["histograms"]["store_seconds"]) == 1
        assert engine.worker.get_kv_connector_stats() is None, "the same copies counted twice"
    finally:
        engine.worker.shutdown()
