"""vLLM's stock connector classes that import here, each with a recording subclass.

A recording subclass keeps the stock class's class-level members (its classmethods answer as
the stock class does) and replaces each instance member the stock class overrides with one
that records its arguments and answers a known value: building a real NixlConnector needs an
agent, a real OffloadingConnector a GPU. The subclasses are module attributes, so vLLM's
factory loads them by kv_connector_module_path like any connector.
"""

from typing import Any, Final

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from kvscope.traces.forwarding import API_CLASSES, vllm_connector_api
from tests.conformance.examples import example_answers

MODULE: Final = __name__
"""kv_connector_module_path of the recording classes."""


def api_members() -> dict[str, str]:
    """Every public member of vLLM's connector API and its kind."""
    return {
        name: member.kind
        for members in vllm_connector_api().values()
        for name, member in members.items()
    }


def declared_by(cls: type, name: str) -> Any:
    return next((vars(k)[name] for k in cls.__mro__ if name in vars(k)), None)


def overridden(stock: type) -> list[str]:
    """The API members the stock class (or a class between it and vLLM's base) overrides."""
    return sorted(
        name
        for name in api_members()
        if (owner := next((k for k in stock.__mro__ if name in vars(k)), None)) is not None
        and owner not in API_CLASSES
    )


def importable_stock_classes() -> tuple[dict[str, type], dict[str, str]]:
    """vLLM's registered connectors: (name -> class of those that import, name -> why not);
    never kvscope's own, which its plugin registers in the same registry."""
    from kvscope.connector.plugin import CONNECTORS

    classes, missing = {}, {}
    for name in sorted(set(KVConnectorFactory._registry) - set(CONNECTORS)):
        try:
            classes[name] = KVConnectorFactory.get_connector_class_by_name(name)
        except Exception as error:  # a connector's optional dependency (lmcache, mooncake...)
            missing[name] = f"{type(error).__name__}: {error}"
    return classes, missing


class Recording:
    """What every recording subclass adds: the calls it got and the answers it gives."""

    calls: list[tuple[str, tuple, dict]]
    answers: dict[str, Any]

    def calls_of(self, name: str) -> list[tuple[tuple, dict]]:
        return [(args, kwargs) for called, args, kwargs in self.calls if called == name]


def _init(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
    KVConnectorBase_V1.__init__(self, vllm_config, role, kv_cache_config)
    self.calls = []
    self.answers = example_answers()


def _recorder(name: str):
    def record(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((name, args, kwargs))
        return self.answers.get(name)

    record.__name__ = name
    return record


def _recorded_property(name: str) -> property:
    """Answers the opposite of vLLM's default, so that only a forwarded answer matches."""

    def get(self) -> Any:
        self.calls.append((name, (), {}))
        return not getattr(KVConnectorBase_V1, name).fget(self)

    return property(get)


def recording_class(registered_name: str, stock: type) -> type:
    """Named by the registered name (vLLM registers one class under several: NixlConnector is
    NixlPullConnector)."""
    namespace: dict[str, Any] = {"__init__": _init, "__module__": MODULE}
    kinds = api_members()
    for member in overridden(stock):
        if kinds[member] == "method":
            namespace[member] = _recorder(member)
        elif kinds[member] == "property":
            namespace[member] = _recorded_property(member)
    return type(f"Recording{registered_name}", (Recording, stock), namespace)


STOCK, NOT_IMPORTABLE = importable_stock_classes()
"""vLLM's stock connector classes by registered name, and those that do not import here."""

RECORDING: Final = {name: recording_class(name, stock) for name, stock in STOCK.items()}
"""A recording subclass of each stock class, by the stock class's registered name."""

globals().update({cls.__name__: cls for cls in RECORDING.values()})


def stock_members() -> list[tuple[str, str]]:
    """(stock connector name, API member it overrides): what the conformance tests check."""
    return [(name, member) for name, stock in STOCK.items() for member in overridden(stock)]
