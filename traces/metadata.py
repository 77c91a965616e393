"""Connector metadata sent from scheduler to workers: the inner connector's own, with the step's
trace context beside it.

What the scheduler hands on (SchedulerOutput.kv_connector_metadata, read by vLLM's runners, its
tests and users' tooling) is the wrapped connector's own metadata object: the trace rides on it as
one attribute (TRACE_ATTRIBUTE), pickled with it to the workers. Only metadata that cannot take
an attribute (None, slots, frozen) is sent wrapped in a TracedMetadata.
"""

from dataclasses import dataclass, field, replace
from typing import Any, Final

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

TRACED_METADATA_VERSION = 1
TRACE_ATTRIBUTE: Final = "kvscope_trace"
"""The attribute of the inner metadata that holds the step's trace (a TracedMetadata without
its inner)."""


@dataclass
class TracedMetadata(KVConnectorMetadata):
    """Wraps the inner connector's metadata for one step.

    `reqs_trace_context` maps each request with KV work this step to its W3C traceparent, so
    worker spans join the request's trace; `reqs_to_load` are those loading external KV;
    `reqs_preempted` those vLLM preempted this step.
    """

    inner: KVConnectorMetadata | None
    step: int
    reqs_trace_context: dict[str, str] = field(default_factory=dict)
    reqs_to_load: frozenset[str] = frozenset()
    reqs_preempted: frozenset[str] = frozenset()
    quiet: bool = False  # an empty step (vLLM keeps stepping while blocks are held): no spans
    version: int = TRACED_METADATA_VERSION


def carry(inner: Any, trace: TracedMetadata) -> Any:
    """What build_connector_meta returns: the inner metadata with the trace (built without an
    inner) on it, or the trace holding the inner when that cannot take an attribute."""
    if inner is None:
        return trace
    try:
        setattr(inner, TRACE_ATTRIBUTE, trace)
    except (AttributeError, TypeError):  # slots, a frozen dataclass, an immutable type
        return replace(trace, inner=inner)
    return inner


def trace_of(metadata: Any) -> tuple[TracedMetadata | None, Any]:
    """(the step's trace, the inner metadata) from what a worker is given; (None, metadata)
    for metadata no traced scheduler built."""
    if isinstance(metadata, TracedMetadata):
        return metadata, metadata.inner
    return getattr(metadata, TRACE_ATTRIBUTE, None), metadata
