"""Every member of vLLM's connector API that a stock connector overrides reaches it through
TracedConnector and through kvscope's Multi: same arguments, same answer.

Generated from the installed vLLM: the members from KVConnectorBase_V1 and SupportsHMA, the
classes from vLLM's connector registry. A member vLLM adds that the wrappers do not forward
fails here by name.
"""

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from tests.conformance.recording import NOT_IMPORTABLE, RECORDING, api_members, stock_members
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
