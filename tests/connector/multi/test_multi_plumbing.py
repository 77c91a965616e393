"""What vLLM asks KvscopeMultiConnector directly (no engine): handshake metadata, the finished
count, the other plumbing hooks and stats reach the children and come back."""

import functools
from types import SimpleNamespace

import prometheus_client
import pytest
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlKVConnectorStats
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.multi.stats import MultiStats
from kvscope.harness import configs
from tests.connector.multi.fake_children import Handshake, SummedStats
from tests.connector.multi.test_child_config import NIXL, outer

FAKE = "tests.connector.multi.fake_children"


def child(name: str, **extra) -> dict:
    return configs.child(name, "RecordingConnector", FAKE, owner=name, **extra)


def multi(*children: dict, role=KVConnectorRole.WORKER) -> KvscopeMultiConnector:
    config = outer(*children, role="kv_both")
    vllm_config = SimpleNamespace(
        kv_transfer_config=config,
        cache_config=SimpleNamespace(block_size=32),
        parallel_config=SimpleNamespace(world_size=1),
    )
    return KvscopeMultiConnector(vllm_config, role, None)


def recorded(connector: KvscopeMultiConnector, name: str) -> list[tuple[str, object]]:
    return next(c.connector.calls for c in connector.inner.children if c.name == name)


def test_handshake_metadata_is_the_first_childs_that_has_some():
    connector = multi(child("quiet"), child("nixl", handshake=True), child("p2p", handshake=True))
    assert connector.get_handshake_metadata() == Handshake("nixl")
    assert multi(child("quiet")).get_handshake_metadata() is None


def test_the_workers_handshake_metadata_reaches_every_child():
    """What vLLM's engine core hands the scheduler side (EngineCore.update_max_model_len)."""
    connector = multi(child("a"), child("b"), role=KVConnectorRole.SCHEDULER)
    connector.set_xfer_handshake_metadata_pp_aware(
        {(0, 0): Handshake("w0"), (0, 1): Handshake("w1")}
    )
    expected = [("set_xfer_handshake_metadata", {0: Handshake("w0"), 1: Handshake("w1")})]
    assert recorded(connector, "a") == recorded(connector, "b") == expected


def test_finished_count_feeds_vllms_output_aggregator():
    agreeing = multi(child("a", finished_count=1), child("b", finished_count=1))
    assert KVOutputAggregator.from_connector(agreeing, world_size=4)._expected_finished_count == 1
    # A child without a count of its own: vLLM's default, the world size.
    some = multi(child("a", finished_count=1), child("b"))
    assert KVOutputAggregator.from_connector(some, world_size=4)._expected_finished_count == 4
    with pytest.raises(ValueError, match=r"different finished counts \[1, 2\]"):
        multi(child("a", finished_count=1), child("b", finished_count=2)).get_finished_count()


def test_model_runner_plumbing_reaches_every_child():
    connector = multi(child("a"), child("b"))
    connector.set_host_xfer_buffer_ops(print)
    connector.finish_forward()
    expected = [("set_host_xfer_buffer_ops", print), ("finish_forward", None)]
    assert recorded(connector, "a") == recorded(connector, "b") == expected


def test_stats_are_each_childs_by_name_and_survive_the_trip_to_the_logger():
    connector = multi(
        child("hot", stats={"loaded_blocks": 3}),
        child("idle"),
        child("cold", stats={"loaded_blocks": 1, "stored_blocks": 2}),
    )
    stats = connector.get_kv_connector_stats()
    assert isinstance(stats, MultiStats) and set(stats.data) == {"hot", "cold"}
    assert stats["hot"].data == {"loaded_blocks": 3}
    # The scheduler sends to_dict() to the logger process as msgpack; vLLM's logger rebuilds
    # it with the configured class, then accumulates and logs.
    wire = MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict()))
    rebuilt = KvscopeMultiConnector.build_kv_connector_stats(wire)
    assert {name: s.data for name, s in rebuilt.data.items()} == {
        n: s.data for n, s in stats.data.items()
    }
    assert all(isinstance(s, SummedStats) for s in rebuilt.data.values())
    logging = KVConnectorLogging(connector._kv_transfer_config)
    logging.observe(wire)
    logging.observe(wire)
    lines = []
    logging.log(lambda fmt, *args: lines.append(fmt % args))
    assert lines == [
        "KV Transfer metrics: hot={'loaded_blocks': 6}, "
        "cold={'loaded_blocks': 2, 'stored_blocks': 4}"
    ]


def test_stats_from_another_version_are_refused():
    with pytest.raises(ValueError, match="version 2, expected 1"):
        KvscopeMultiConnector.build_kv_connector_stats({"version": 2, "children": {}})
    bad = {"version": 1, "children": {"x": {"stats": {}}}}
    with pytest.raises(ValueError, match="child 'x' needs kv_connector"):
        KvscopeMultiConnector.build_kv_connector_stats(bad)


def test_each_childs_prometheus_metrics_observe_its_part_of_the_stats():
    registry = prometheus_client.CollectorRegistry()
    types = {
        kind: functools.partial(kind, registry=registry)
        for kind in (
            prometheus_client.Gauge,
            prometheus_client.Counter,
            prometheus_client.Histogram,
        )
    }
    config = outer(NIXL, child("offload"), role="kv_both")
    vllm_config = SimpleNamespace(kv_transfer_config=config)
    metrics = KvscopeMultiConnector.build_prom_metrics(vllm_config, types, ["engine"], {0: ["0"]})
    nixl = NixlKVConnectorStats()
    nixl.data["bytes_transferred"].append(4096)
    stats = MultiStats()
    stats.add("NixlConnector", ("NixlConnector", None), nixl)
    stats.add("offload", ("RecordingConnector", FAKE), SummedStats(data={"loaded_blocks": 1}))
    metrics.observe(MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict())))
    sample = registry.get_sample_value("vllm:nixl_bytes_transferred_sum", {"engine": "0"})
    assert sample == 4096


def test_a_traced_childs_stats_are_rebuilt_by_the_class_it_wraps():
    """A TracedConnector child is built as the class it wraps; the logger process, which builds
    no connector, must rebuild that class's stats (the config names only TracedConnector)."""
    traced = configs.traced_child(
        "RecordingConnector", connector_module_path=FAKE, owner="traced", stats={"loaded_blocks": 2}
    )
    stats = multi(traced).get_kv_connector_stats()
    wire = MsgpackDecoder().decode(MsgpackEncoder().encode(stats.to_dict()))
    rebuilt = KvscopeMultiConnector.build_kv_connector_stats(wire)
    assert isinstance(rebuilt["traced"], SummedStats)
    assert rebuilt["traced"].data == {"loaded_blocks": 2}
