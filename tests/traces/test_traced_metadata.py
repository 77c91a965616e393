"""What a traced scheduler hands on is the wrapped connector's own metadata, the step's trace
riding on it: vLLM's real Scheduler's output holds the connector's type, the trace survives the
pickling that carries it to workers, and metadata that cannot take it is wrapped instead."""

import dataclasses
import pickle

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from kvscope.connector.cpu_offload.metadata import OffloadMetadata
from kvscope.traces.metadata import TRACE_ATTRIBUTE, TracedMetadata, carry, trace_of
from tests.connector.hook_orders import BLOCK, HookOrder, Rig, request, traced_transfer


def test_the_scheduler_output_holds_the_connectors_own_metadata_with_the_trace(
    tiny_model, span_exporter
):
    rig = Rig(tiny_model, traced_transfer())
    rig.add(request("r1", list(range(3 * BLOCK + 1)), 2))
    output = rig.step(HookOrder.V2)
    metadata = output.kv_connector_metadata
    assert type(metadata) is OffloadMetadata, "vLLM's runners and tools see another type"
    trace, inner = trace_of(pickle.loads(pickle.dumps(metadata)))
    assert inner.reqs_to_store and trace is not None
    assert trace.step == 1 and "r1" in trace.reqs_trace_context
    assert getattr(metadata, TRACE_ATTRIBUTE).inner is None, "no cycle through the trace"


@dataclasses.dataclass(frozen=True)
class FrozenMetadata(KVConnectorMetadata):
    blocks: tuple[int, ...] = ()


def test_metadata_that_cannot_take_the_trace_is_wrapped_and_unwrapped():
    trace = TracedMetadata(None, 7, quiet=True)
    frozen = FrozenMetadata((1, 2))
    sent = carry(frozen, trace)
    assert isinstance(sent, TracedMetadata) and sent.inner is frozen
    assert trace_of(sent) == (sent, frozen)
    assert carry(None, trace) is trace and trace_of(trace) == (trace, None)


def test_metadata_no_traced_scheduler_built_has_no_trace():
    plain = OffloadMetadata([], [], set(), set(), 4)
    assert trace_of(plain) == (None, plain)
