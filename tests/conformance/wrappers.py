"""kvscope's wrappers (TracedConnector, the Multi) over a recording stock class, and how to call
any member of vLLM's connector API through them the way vLLM would."""

import copy
import functools
from typing import Any, Final

from vllm.config import DeviceConfig, VllmConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.traced import TracedBase
from kvscope.harness import configs
from kvscope.traces.forwarding import vllm_connector_api
from kvscope.traces.metadata import trace_of
from tests.conformance.examples import ARGS_BY_MEMBER, Token, example_args
from tests.conformance.recording import MODULE, RECORDING

WRAPPERS: Final = ("traced", "traced_as", "multi")
"""TracedConnector over the class, the class traced under its own name (connector/traced_as.py),
and KvscopeMultiConnector with the class as its one child."""
TRACED: Final = ("traced", "traced_as")
"""The wrappers that are a TracedConnector (`inner` is the wrapped connector)."""

SETUP: Final = {
    "update_state_after_alloc": ("get_num_new_matched_tokens",),
    "get_external_cache_hit_sources": ("get_num_new_matched_tokens",),
    "get_loaded_kv_cache_group_ids": ("get_num_new_matched_tokens",),
    "bind_connector_metadata": ("build_connector_meta",),
    "handle_preemptions": ("build_connector_meta",),
    "get_block_ids_with_load_errors": ("get_transfer_results",),
}
"""What vLLM calls before a member in a step (the Multi routes a request by its lookup, and
collects load errors while it gathers transfer results)."""

METADATA_PARAMS: Final = frozenset({"connector_metadata", "kv_connector_metadata"})
"""Parameters that take what build_connector_meta made (the scheduler's, sent to workers)."""


@functools.cache
def _engine_config() -> VllmConfig:
    # An explicit device: vLLM 0.34's own code here runs on no platform, which 'auto' refuses.
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    config.cache_config.block_size = 32
    return config


def vllm_config(kv_transfer_config: KVTransferConfig) -> VllmConfig:
    config = copy.copy(_engine_config())
    config.kv_transfer_config = kv_transfer_config
    return config


def wrapper_config(wrapper: str, stock_name: str) -> KVTransferConfig:
    recording = RECORDING[stock_name].__name__
    # vLLM's default load-failure policy, which inner_config leaves the wrapped class too.
    if wrapper == "traced":
        traced = configs.traced_child(recording, connector_module_path=MODULE)
        return KVTransferConfig(**configs.engine_config(traced, policy="fail"))
    if wrapper == "traced_as":
        traced_as = {
            "kv_connector": f"{MODULE}.{recording}",
            "kv_connector_module_path": "kvscope.connector.traced_as",
        }
        return KVTransferConfig(**configs.engine_config(traced_as, policy="fail"))
    child = configs.child(recording, recording, MODULE)
    return KVTransferConfig(**configs.multi_config(child, policy="fail"))


def inner_config(stock_name: str) -> KVTransferConfig:
    """What either wrapper gives the wrapped class: its name and module, the outer role."""
    recording = RECORDING[stock_name].__name__
    return KVTransferConfig(
        kv_connector=recording, kv_connector_module_path=MODULE, kv_role="kv_both"
    )


def build(wrapper: str, stock_name: str, role=KVConnectorRole.WORKER):
    """(the wrapper, the recording instance inside it)."""
    config = vllm_config(wrapper_config(wrapper, stock_name))
    if wrapper in TRACED:
        cls = KVConnectorFactory.get_connector_class(config.kv_transfer_config)
        assert issubclass(cls, TracedBase)
        connector = cls(config, role, None)
        return connector, connector.inner
    connector = KvscopeMultiConnector(config, role, None)
    return connector, connector.inner.children[0].connector


def outcome(call, *args):
    """A call's answer, or the error it raised (the same error is the same answer)."""
    try:
        return "answer", call(*args)
    except Exception as error:
        return "error", (type(error), str(error))


def api_params(name: str) -> tuple[str, ...]:
    """The named parameters of a member of vLLM's connector API (no *args, **kwargs)."""
    for members in vllm_connector_api().values():
        if name in members:
            return tuple(p for p in members[name].params if not p.startswith("*"))
    raise KeyError(name)


def arguments(name: str, args: dict[str, Any]) -> tuple:
    """The member's arguments by parameter name; a name no example has gets a Token."""
    return tuple(args[p] if p in args else Token(p) for p in api_params(name))


def call(connector: KVConnectorBase_V1, name: str, args: dict[str, Any]) -> Any:
    return getattr(connector, name)(*arguments(name, args))


def call_as_vllm(connector: KVConnectorBase_V1, name: str) -> tuple[Any, tuple, dict]:
    """Calls name through connector after what vLLM calls first; returns (the answer, the
    arguments the wrapped connector should get, the arguments given)."""
    args = {**example_args(), **ARGS_BY_MEMBER.get(name, {})}
    for before in SETUP.get(name, ()):
        answer = call(connector, before, args)
        if before == "build_connector_meta":
            args.update(dict.fromkeys(METADATA_PARAMS, answer))
    answer = call(connector, name, args)
    given = arguments(name, args)
    return answer, given, args


def unwrap(wrapper: str, name: str, answer: Any, child_name: str) -> Any:
    """The wrapped connector's answer inside the wrapper's (which adds its own framing)."""
    if name == "build_connector_meta":
        trace, answer = trace_of(answer)  # every wrapper traces: the step's trace rides on it
        assert trace is not None, "the wrapper's metadata carries no trace"
    if wrapper == "traced" and name == "get_kv_connector_stats":
        return answer.inner  # traced_as hands on the connector's own stats
    if wrapper == "multi" and name in ("build_connector_meta", "build_connector_worker_meta"):
        return answer.children[0]
    if wrapper == "multi" and name == "get_kv_connector_stats":
        return answer.data[child_name]
    return answer
