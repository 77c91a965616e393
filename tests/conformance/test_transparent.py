"""The traced wrappers present the connector they wrap to code that holds them, as wrapt's
ObjectProxy does for OpenTelemetry's instrumentations: isinstance answers for the wrapped class,
a public attribute outside vLLM's connector API is read from and written to the wrapped
connector; private names, type(), the API's members and the hooks stay the wrapper's. The Multi
is not its child."""

import copy

import pytest

from kvscope.connector.traced import TracedBase
from tests.conformance.recording import RECORDING
from tests.conformance.wrappers import TRACED, build, call_as_vllm

STOCK = "OffloadingConnector"


@pytest.mark.parametrize("wrapper", TRACED)
def test_isinstance_answers_for_the_wrapped_class_and_type_stays_the_wrappers(wrapper):
    connector, inner = build(wrapper, STOCK)
    assert isinstance(connector, RECORDING[STOCK])
    assert isinstance(connector, type(inner).__mro__[1])  # the stock class itself
    assert issubclass(type(connector), TracedBase)
    assert not isinstance(inner, TracedBase)


@pytest.mark.parametrize("wrapper", TRACED)
def test_what_the_api_does_not_name_is_the_wrapped_connectors(wrapper):
    connector, inner = build(wrapper, STOCK)
    inner.own_state = {"blocks": 3}
    assert connector.own_state is inner.own_state
    connector.own_state = {"blocks": 4}  # the wrapped connector has it: written there
    assert inner.own_state == {"blocks": 4}
    assert "own_state" not in vars(connector)
    connector.added_here = 1  # neither has it: the wrapper's own
    assert not hasattr(inner, "added_here")
    with pytest.raises(AttributeError, match="no attribute 'missing'"):
        _ = connector.missing
    inner._private_state = 1  # private names stay each object's own
    assert getattr(connector, "_private_state", None) is None
    connector._private_state = 2
    assert inner._private_state == 1


@pytest.mark.parametrize("wrapper", TRACED)
def test_the_hooks_stay_traced_and_dunders_stay_the_wrappers(wrapper):
    connector, inner = build(wrapper, STOCK)
    answer, given, _ = call_as_vllm(connector, "get_num_new_matched_tokens")
    assert inner.calls_of("get_num_new_matched_tokens") == [(given, {})]
    assert type(copy.copy(connector)) is type(connector)


def test_the_multi_is_not_its_child():
    connector, inner = build("multi", STOCK)
    assert not isinstance(connector, RECORDING[STOCK])
    with pytest.raises(AttributeError):
        _ = connector.connector_scheduler
