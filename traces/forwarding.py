"""vLLM's KV connector API as data, and the members a wrapping connector forwards untraced."""

import inspect
from dataclasses import dataclass
from typing import Any, Final

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA

API_CLASSES: Final = (KVConnectorBase_V1, SupportsHMA)
"""vLLM's classes whose public members make up the connector API every wrapper must keep."""

ANSWERED_BY_WRAPPER: Final = frozenset({"has_connector_metadata"})
"""Base members a wrapper keeps as vLLM wrote them: it binds its own metadata as the base class
does, so the answer is the wrapped connector's (vLLM's attention layers ask it once per layer,
where a forwarding call would cost one more frame). The conformance tests hold it to that."""


@dataclass(frozen=True)
class Member:
    """One member of a class's API: its kind and its parameters (without self or cls)."""

    kind: str  # "method", "classmethod", "staticmethod", "property" or "attribute"
    params: tuple[str, ...] = ()


def parameter_names(function: Any, bound: bool) -> tuple[str, ...]:
    """Parameter names as written: '*args' and '**kwargs' marked, self or cls left out."""
    names = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.VAR_POSITIONAL:
            names.append("*" + parameter.name)
        elif parameter.kind is parameter.VAR_KEYWORD:
            names.append("**" + parameter.name)
        else:
            names.append(parameter.name)
    return tuple(names[1:] if bound else names)


def member_of(value: Any) -> Member:
    """What a class attribute is, read statically (no descriptor runs)."""
    if isinstance(value, classmethod):
        return Member("classmethod", parameter_names(value.__func__, bound=True))
    if isinstance(value, staticmethod):
        return Member("staticmethod", parameter_names(value.__func__, bound=False))
    if isinstance(value, property):
        return Member("property")
    if inspect.isfunction(value):
        return Member("method", parameter_names(value, bound=True))
    return Member("attribute")


def declared_api(cls: type) -> dict[str, Member]:
    """The public members cls itself declares."""
    return {name: member_of(value) for name, value in vars(cls).items() if not name.startswith("_")}


def vllm_connector_api() -> dict[str, dict[str, Member]]:
    """The installed vLLM's connector API: each API class's public members."""
    return {cls.__name__: declared_api(cls) for cls in API_CLASSES}


def api_member_names() -> frozenset[str]:
    return frozenset(name for members in vllm_connector_api().values() for name in members)


def left_to_vllm(cls: type, name: str) -> bool:
    """Whether cls answers name with vLLM's own API class, i.e. nothing of cls's overrides it."""
    for klass in cls.__mro__:
        if name in vars(klass):
            return klass in API_CLASSES
    return False


def install_forwarders(cls: type, inner_attribute: str = "_inner") -> frozenset[str]:
    """Gives cls a forwarding method or property for every instance member of vLLM's connector
    API that cls leaves to vLLM's base class (except ANSWERED_BY_WRAPPER): what vLLM adds to
    its API reaches the wrapped connector without a line here. Returns the names forwarded."""
    forwarded = []
    for name, member in declared_api(KVConnectorBase_V1).items():
        if name in ANSWERED_BY_WRAPPER or not left_to_vllm(cls, name):
            continue
        if member.kind == "method":
            setattr(cls, name, _forwarding_method(name, inner_attribute))
        elif member.kind == "property":
            setattr(cls, name, _forwarding_property(name, inner_attribute))
        else:
            continue  # class-level members: the wrapper asks its inner class itself
        forwarded.append(name)
    return frozenset(forwarded)


def _forwarding_method(name: str, inner_attribute: str):
    base = getattr(KVConnectorBase_V1, name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(getattr(self, inner_attribute), name)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"Forwarded to the wrapped connector's {name}."
    # typeshed's FunctionType declares no __signature__, which inspect.signature() reads.
    forward.__signature__ = inspect.signature(base)  # type: ignore[attr-defined]
    return forward


def _forwarding_property(name: str, inner_attribute: str) -> property:
    def get(self) -> Any:
        return getattr(getattr(self, inner_attribute), name)

    return property(get, doc=f"The wrapped connector's {name}.")
