"""Turns a running in-process engine's TracedConnector off and on: while off, vLLM calls the
wrapped connector's own methods, as if it had loaded that connector directly.

bench/engine/tracing_overhead.py times the same engine both ways, batch after batch, so the untraced
figure comes from the same process, memory and connector state as the traced one.
"""

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA

from kvscope.traces.instrumented import InstrumentedConnector

HOOKS = tuple(
    name
    for base in (KVConnectorBase_V1, SupportsHMA)
    for name, value in vars(base).items()
    if callable(value) and not name.startswith("__") and name != "shutdown"
)
"""Every method vLLM may call on a connector instance (both roles), but shutdown: the traced
one flushes the spans on the way out. TracedConnector is SupportsHMA, so vLLM ends requests
through request_finished_all_groups."""


def traced_connectors(llm: Any) -> list[InstrumentedConnector]:
    """The scheduler's and the worker's connector of an in-process engine
    (VLLM_ENABLE_V1_MULTIPROCESSING=0): both must be traced ones."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        raise ValueError("switching tracing needs an in-process engine (no engine-core process)")
    connectors = [core.scheduler.connector, get_kv_transfer_group()]
    for connector in connectors:
        if not isinstance(connector, InstrumentedConnector):
            raise ValueError(f"{type(connector).__name__} is not a traced connector")
    return connectors


def set_traced(connectors: list[InstrumentedConnector], traced: bool) -> None:
    """Routes every hook through the tracing wrapper (traced) or straight to the wrapped
    connector (untraced). Switch between batches: a request must not see both."""
    for connector in connectors:
        for name in HOOKS:
            if traced:
                connector.__dict__.pop(name, None)
            elif hasattr(connector.inner, name):
                setattr(connector, name, getattr(connector.inner, name))
            elif name == "request_finished_all_groups":  # a wrapped connector without HMA
                setattr(connector, name, _one_group(connector.inner))


def _one_group(inner: KVConnectorBase_V1):
    """request_finished_all_groups for a connector that knows only request_finished, as the
    traced wrapper calls it (one KV cache group)."""

    def request_finished_all_groups(request: Any, block_ids: tuple[list[int], ...]):
        return inner.request_finished(request, block_ids[0])

    return request_finished_all_groups
