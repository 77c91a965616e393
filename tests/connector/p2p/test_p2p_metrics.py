"""The P2P connector's stats and Prometheus metrics without an engine: both halves' reports,
through msgpack and vLLM's logger, read back with prometheus_client's parser."""

from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from kvscope.connector.common.stats_schema import MAX_SAMPLES, Counters, IntervalReporter, Samples
from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.connector import P2PConnector
from kvscope.connector.p2p.metadata import P2PWorkerMeta
from kvscope.connector.p2p.scheduler import P2PScheduler
from kvscope.connector.p2p.stats import (
    SCHEDULER_COUNTERS,
    SCHEMA,
    WORKER_COUNTERS,
    LoanCounters,
    P2PStats,
    ReadCounters,
    SchedulerCounters,
)
from tests.connector.p2p.test_p2p_protocol import BLOCK, Request, prefilled
from tests.connector.prom_scrape import exactly, registry_types, scrape_registry

LABELS = {"model_name": "tiny", "engine": "0"}
READ_BYTES = 3 * 65536


def decode_with_three_lookups() -> P2PScheduler:
    """Pulls d-ok (read) and d-bad (read_failed on one rank); d-junk's params are refused."""
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    for req_id in ("d-ok", "d-bad"):
        _, params = prefilled()
        request = Request(req_id, 100, dict(params))
        assert decode.lookup(request, 0) == (99, True)
        decode.bind(request, ([10, 11, 12, 13],), 99)
    junk = Request("d-junk", 100, {"do_remote_prefill": True, "remote_engine_id": 7})
    assert decode.lookup(junk, 0) == (0, False)
    decode.on_worker_output(
        P2PWorkerMeta(loads_failed={"d-bad": "read_failed: boom"}), set(), set()
    )
    decode.on_worker_output(P2PWorkerMeta(), set(), {"d-ok", "d-bad"})
    return decode


def scheduler_report(decode: P2PScheduler) -> P2PStats:
    counters, gauges = decode.report_values()
    return IntervalReporter(P2PStats).report(counters, gauges, decode.samples)


def worker_report() -> P2PStats:
    samples = Samples()
    samples.observe("read_seconds", 0.004)
    samples.observe("read_size_bytes", READ_BYTES)
    counters = {"reads": 1, "read_bytes": READ_BYTES, "read_s": 0.004, "handshakes": 1}
    return IntervalReporter(P2PStats).report(counters, {}, samples)


def test_pulls_and_their_failures_are_counted_once_per_request():
    stats = scheduler_report(decode_with_three_lookups())
    data = stats.data
    assert data["counters"] == {"pulls": 2, "pull_tokens": 198, "failed_pulls": 1}
    assert data["failures"] == {"bad_params": {"recomputed": 1}, "read_failed": {"recomputed": 1}}
    assert len(data["histograms"]["kv_wait_seconds"]) == 2
    assert data["gauges"] == {
        "held_requests": 0,
        "pulls_in_flight": 0,
        "peers": 1,
        "peers_bypassed": 0,
    }


def test_inside_a_multi_the_outcome_is_left_to_the_parent():
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    decode.refusal_outcome = decode.failure_outcome = None  # as leave_failure_outcome_to_parent
    junk = Request("d-junk", 100, {"do_remote_prefill": True, "remote_engine_id": 7})
    decode.lookup(junk, 0)
    assert scheduler_report(decode).data["failures"] == {"bad_params": {"left_to_parent": 1}}


def test_a_quiet_interval_reports_nothing():
    decode = P2PScheduler(P2PConfig(), "D", BLOCK)
    reporter = IntervalReporter(P2PStats)
    assert reporter.report(*decode.report_values(), decode.samples) is not None  # first gauges
    assert reporter.report(*decode.report_values(), decode.samples) is None


def test_stats_survive_msgpack_and_vllms_logger_and_stay_bounded():
    samples = Samples()
    for _ in range(MAX_SAMPLES + 5):
        samples.observe("read_seconds", 0.001)
    stats = IntervalReporter(P2PStats).report({"read_bytes": 10**9, "read_s": 0.5}, {}, samples)
    wire = MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict()))
    rebuilt = P2PConnector.build_kv_connector_stats(wire)
    assert rebuilt.data["counters"]["samples_dropped"] == 5
    logging = KVConnectorLogging(None)
    logging.connector_cls = P2PConnector  # what vLLM's factory finds for the config
    logging.observe(wire)
    lines = []
    logging.log(lambda fmt, *args: lines.append(fmt % args))
    assert "read_gb_per_s=2.0" in lines[0] and "read_bytes=1000000000" in lines[0]


def test_stats_of_another_version_or_shape_are_refused():
    with pytest.raises(ValueError, match="P2PConnector stats: version 2, expected 1"):
        P2PConnector.build_kv_connector_stats({"version": 2})
    with pytest.raises(ValueError, match="'failures' must map causes"):
        P2PConnector.build_kv_connector_stats(
            {
                "version": 1,
                "counters": {},
                "gauges": {},
                "histograms": {},
                "failures": {"load_failed": {"recomputed": 1}},
            }
        )


def value(found: dict, name: str, **labels: str) -> float:
    return exactly(found, name, **LABELS, **labels)


def test_prometheus_metrics_carry_vllms_labels_and_both_halves_values():
    stats = worker_report().aggregate(scheduler_report(decode_with_three_lookups()))
    registry, types = registry_types()
    vllm_config = SimpleNamespace(kv_transfer_config=SimpleNamespace(kv_connector_extra_config={}))
    metrics = P2PConnector.build_prom_metrics(
        vllm_config, types, ["model_name", "engine"], {0: ["tiny", "0"]}
    )
    metrics.observe(MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict())), 0)
    found = scrape_registry(registry)
    assert value(found, "vllm:kvscope_p2p_pulls_total") == 2
    assert value(found, "vllm:kvscope_p2p_failed_pulls_total") == 1
    assert value(found, "vllm:kvscope_p2p_read_bytes_total") == READ_BYTES
    assert value(found, "vllm:kvscope_p2p_read_busy_seconds_total") == pytest.approx(0.004)
    assert value(found, "vllm:kvscope_p2p_read_duration_seconds_count") == 1
    assert value(found, "vllm:kvscope_p2p_read_size_bytes_sum") == READ_BYTES
    assert value(found, "vllm:kvscope_p2p_kv_wait_seconds_count") == 2
    assert value(found, "vllm:kvscope_p2p_peers") == 1
    assert (
        value(found, "vllm:kvscope_p2p_failures_total", cause="read_failed", outcome="recomputed")
        == 1
    )


def test_the_halves_count_exactly_the_counters_the_schema_names_for_them():
    """A counter the schema names that no half counts (or one counted twice) shows up here."""
    assert tuple(SchedulerCounters().as_dict()) == SCHEDULER_COUNTERS
    worker = {**LoanCounters().as_dict(), **ReadCounters().as_dict()}
    assert set(worker) - {"leases_expired"} == set(WORKER_COUNTERS), "the scheduler counts those"
    with pytest.raises(TypeError, match="add them to its counters"):
        SCHEMA.counted_by(dataclass(type("Typo", (Counters,), {"__annotations__": {"red": int}})))
