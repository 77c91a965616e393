"""Connector metadata sent from scheduler to workers: the inner connector's plus trace context."""

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

TRACED_METADATA_VERSION = 1


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
