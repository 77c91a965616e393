"""Every member of vLLM's connector API that a stock connector overrides reaches it through
TracedConnector and through kvscope's Multi: same arguments, same answer.

Generated from the installed vLLM: the members from KVConnectorBase_V1 and SupportsHMA, the
classes from vLLM's connector registry. A member vLLM adds that the wrappers do not forward
fails here by name.
"""

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from tests.conformance.recording import (
    NOT_IMPORTABLE,
    RECORDING,
    STOCK,
    api_members,
    overridden,
    stock_members,
)
from tests.conformance.wrappers import WRAPPERS, build, call_as_vllm, unwrap

INSTANCE_MEMBERS = [
    (stock, member)
    for stock, member in stock_members()
    if api_members()[member] in ("method", "property")
]


def test_the_stock_classes_the_issue_names_import_here():
    """Nixl, Example, Offloading, SimpleCPUOffload, LMCache, Multi, Mooncake: a class that stops
    importing would silently leave the conformance tests."""
    expected = {
        "NixlConnector",
        "ExampleConnector",
        "OffloadingConnector",
        "SimpleCPUOffloadConnector",
        "LMCacheConnectorV1",
        "MultiConnector",
        "MooncakeConnector",
    }
    assert expected <= set(RECORDING), NOT_IMPORTABLE


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize(("stock", "member"), INSTANCE_MEMBERS)
def test_member_reaches_the_stock_connector(wrapper, stock, member):
    connector, inner = build(wrapper, stock)
    if api_members()[member] == "property":
        answer = getattr(connector, member)
        assert inner.calls_of(member), f"{member} was answered without asking {stock}"
        assert answer == (not getattr(KVConnectorBase_V1, member).fget(inner))
        return
    answer, given, _ = call_as_vllm(connector, member)
    received = inner.calls_of(member)
    if wrapper == "multi" and member == "get_finished":
        # The Multi asks each child get_transfer_results (whose default asks get_finished).
        received += inner.calls_of("get_transfer_results")
    expected = tuple(
        inner.answers["build_connector_meta"] if name.endswith("connector_metadata") else value
        for name, value in zip(_params(member), given, strict=True)
    )
    assert (expected, {}) in received, f"{member} did not reach {stock} with vLLM's arguments"
    child_name = RECORDING[stock].__name__
    assert unwrap(wrapper, member, answer, child_name) == inner.answers.get(member)


def _params(member):
    from tests.conformance.wrappers import api_params

    return api_params(member)


HIT_SOURCES = [
    name
    for name, stock in sorted(STOCK.items())
    if stock._cache_hit_source is not KVConnectorBase_V1._cache_hit_source
    and "get_external_cache_hit_sources" not in overridden(stock)
]


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("stock", HIT_SOURCES)
def test_a_stock_classes_hit_source_is_reported_through_the_wrapper(wrapper, stock):
    """NIXL and Mooncake label their hits P2P with a class attribute that vLLM's base method
    reads: asked through a wrapper, the hit must still be theirs, not the wrapper's."""
    connector, inner = build(wrapper, stock)
    answer, _, args = call_as_vllm(connector, "get_external_cache_hit_sources")
    expected = KVConnectorBase_V1.get_external_cache_hit_sources(
        inner, args["request"], args["num_external_tokens"]
    )
    assert answer == expected == {STOCK[stock]._cache_hit_source: args["num_external_tokens"]}
