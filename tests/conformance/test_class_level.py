"""vLLM's class-level questions (asked of the configured class before any connector exists) get
each stock class's own answer through TracedConnector and through kvscope's Multi.

The members come from vLLM's base class: a classmethod vLLM adds fails here by name until a
test of its round trip through both wrappers is written.
"""

import functools

import prometheus_client
import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

from tests.conformance.recording import RECORDING, STOCK, api_members, overridden
from tests.conformance.test_transfer_config_questions import QUESTIONS
from tests.conformance.wrappers import (
    WRAPPERS,
    build,
    inner_config,
    outcome,
    vllm_config,
    wrapper_config,
)

CLASS_LEVEL = sorted(
    n for n, kind in api_members().items() if kind in ("classmethod", "staticmethod")
)


def wrapper_class(wrapper: str, stock: str) -> type:
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    return KVConnectorFactory.get_connector_class(wrapper_config(wrapper, stock))


def fresh_metric_types() -> dict:
    registry = prometheus_client.CollectorRegistry()
    kinds = (prometheus_client.Gauge, prometheus_client.Counter, prometheus_client.Histogram)
    return {kind: functools.partial(kind, registry=registry) for kind in kinds}


def test_every_class_level_member_has_a_check_here():
    """A classmethod vLLM adds needs its own round trip below (or, for those that take a
    KVTransferConfig alone, in test_transfer_config_questions): the test names it."""
    checked = set(QUESTIONS) | {
        "build_kv_connector_stats",
        "build_prom_metrics",
        "get_required_kvcache_layout",
        "requires_piecewise_for_cudagraph",
    }
    assert set(CLASS_LEVEL) <= checked, sorted(set(CLASS_LEVEL) - checked)


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("stock", sorted(STOCK))
def test_required_kvcache_layout_is_the_stock_classes(wrapper, stock):
    own = outcome(RECORDING[stock].get_required_kvcache_layout, vllm_config(inner_config(stock)))
    config = vllm_config(wrapper_config(wrapper, stock))
    assert outcome(wrapper_class(wrapper, stock).get_required_kvcache_layout, config) == own


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("stock", sorted(STOCK))
def test_piecewise_cuda_graphs_are_asked_of_the_stock_class(wrapper, stock):
    own = outcome(RECORDING[stock].requires_piecewise_for_cudagraph, {})
    extra = wrapper_config(wrapper, stock).kv_connector_extra_config
    assert outcome(wrapper_class(wrapper, stock).requires_piecewise_for_cudagraph, extra) == own


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("stock", sorted(STOCK))
def test_prometheus_metrics_are_the_stock_classes(wrapper, stock):
    args = (["engine"], {0: ["0"]})
    kind, own = outcome(
        RECORDING[stock].build_prom_metrics,
        vllm_config(inner_config(stock)),
        fresh_metric_types(),
        *args,
    )
    config = vllm_config(wrapper_config(wrapper, stock))
    through = outcome(
        wrapper_class(wrapper, stock).build_prom_metrics, config, fresh_metric_types(), *args
    )
    if kind == "error" or own is None:
        assert through == (kind, own)
        return
    metrics = through[1]
    if wrapper == "traced_as":  # the class knows its connector: its metrics, as they are
        inner = metrics
    elif wrapper == "traced":
        inner = metrics.inner
    else:
        inner = metrics.children[RECORDING[stock].__name__]
    assert type(inner) is type(own)


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize(
    "stock", [s for s in sorted(STOCK) if "build_kv_connector_stats" in overridden(STOCK[s])]
)
def test_stats_survive_the_trip_to_vllms_logger_as_the_stock_classes(wrapper, stock):
    """The stock class's own (empty) stats, reported by the connector inside the wrapper, sent
    as vLLM sends them (to_dict, msgpack) and rebuilt by the configured class, are what the
    stock class rebuilds from its own payload; vLLM's logger does not drop them."""
    own_stats = RECORDING[stock].build_kv_connector_stats(None)
    connector, inner = build(wrapper, stock)
    inner.answers["get_kv_connector_stats"] = own_stats
    reported = connector.get_kv_connector_stats()
    if wrapper == "traced_as":
        # SchedulerStats and KVConnectorOutput carry what the bare connector would: a stat
        # logger of the user's own reads the stock class's payload.
        assert reported is own_stats
    wire = MsgpackDecoder().decode(MsgpackEncoder().encode(reported.to_dict()))
    rebuilt = type(connector).build_kv_connector_stats(wire)
    expected = RECORDING[stock].build_kv_connector_stats(
        MsgpackDecoder().decode(MsgpackEncoder().encode(own_stats.to_dict()))
    )
    if wrapper == "multi":
        rebuilt = rebuilt[RECORDING[stock].__name__]
    assert type(rebuilt) is type(expected)
    assert rebuilt.to_dict() == expected.to_dict()
    logging = KVConnectorLogging(wrapper_config(wrapper, stock))
    logging.observe(wire)
    assert logging.transfer_stats_accumulator is not None, "vLLM's logger dropped the stats"
