"""Hypothesis strategies for OTLP trace exports: odd ids, times, names and attribute trees.

Spans come in two kinds, mixed: anything the protobuf schema allows, and kvscope-shaped ones
(its span, event and attribute names with extreme values) that reach the state derivation.
"""

from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from opentelemetry.proto.trace.v1 import trace_pb2

from kvscope.traces import names

MAX_NS = 2**63
CONSTANTS = [v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)]
SPAN_NAMES = (
    [v for k, v in vars(names).items() if k.startswith("SPAN_")]
    + [
        names.SPAN_HOOK_PREFIX + hook
        for hook in ("get_num_new_matched_tokens", "update_state_after_alloc", "request_finished")
    ]
    + ["llm_request"]
)
EVENT_NAMES = [v for k, v in vars(names).items() if k.startswith("EVENT_")]
# Few ids, so that spans repeat within and across batches (an exporter's retry).
TRACE_POOL = [bytes([n]) * 16 for n in range(1, 4)]
SPAN_POOL = [bytes([n]) * 8 for n in range(1, 6)]


KVSCOPE_KEYS = [
    names.SEQ,
    names.SEQ_ORIGIN,
    names.REQUEST_ID,
    names.ENGINE_ID,
    names.CONNECTOR_ROLE,
    names.TIMELINE_POINT,
    names.LAYER_INDEX,
    names.BLOCK_IDS,
    names.HOST_BLOCK_IDS,
    names.BLOCK_HASHES,
    names.BLOCK_TIER,
    names.LEASE_ID,
    names.LEASE_HOLDER,
    names.LEASE_TIMEOUT_S,
    names.LEASE_OUTCOME,
    names.LOAD_ERROR_BLOCK_IDS,
    names.FAILURE_CAUSE,
    names.TRANSFER_BYTES,
    names.TRANSFER_DURATION_MS,
    names.TRANSFER_GBPS,
    names.TRANSFER_OK,
    names.TOKENS_EXTERNAL_HIT,
    names.TOKENS_TO_LOAD,
    names.PROMPT_TOKENS,
    names.SPANS_EMITTED,
    names.SPANS_DROPPED,
    names.REQUEST_STATUS,
    names.PROCESS_ID,
    "service.name",
]
# --- strategies --------------------------------------------------------------------------------

texts = st.one_of(
    st.text(max_size=12), st.sampled_from(CONSTANTS), st.text(min_size=600, max_size=700)
)
scalars = st.one_of(
    st.tuples(st.just("string_value"), texts),
    st.tuples(st.just("int_value"), st.integers(-(2**63), 2**63 - 1)),
    st.tuples(st.just("double_value"), st.floats()),
    st.tuples(st.just("bool_value"), st.booleans()),
    st.tuples(st.just("bytes_value"), st.binary(max_size=40)),
    st.just(("empty", None)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.tuples(st.just("array_value"), st.lists(inner, max_size=20)),
        st.tuples(st.just("kvlist_value"), st.lists(st.tuples(texts, inner), max_size=5)),
    ),
    max_leaves=12,
)
extreme_ints = st.one_of(st.integers(-5, 40), st.sampled_from([-(2**63), 2**63 - 1, 2**62, -1, 0]))
kvscope_values = st.one_of(
    st.tuples(st.just("int_value"), extreme_ints),
    st.tuples(st.just("double_value"), st.sampled_from([1e308, -1e308, 5e-324, 0.0, 0.5])),
    st.tuples(st.just("string_value"), st.one_of(st.sampled_from(CONSTANTS), st.text(max_size=8))),
    st.tuples(st.just("bool_value"), st.booleans()),
    st.tuples(
        st.just("array_value"),
        st.lists(st.tuples(st.just("int_value"), extreme_ints), max_size=20),
    ),
    values,
)
key_values = st.one_of(
    st.lists(st.tuples(st.one_of(st.sampled_from(CONSTANTS), texts), values), max_size=10),
    st.lists(st.tuples(st.sampled_from(KVSCOPE_KEYS), kvscope_values), max_size=10),
)
ids16 = st.one_of(st.sampled_from(TRACE_POOL), st.binary(min_size=16, max_size=16), st.binary())
ids8 = st.one_of(st.sampled_from(SPAN_POOL), st.binary(min_size=8, max_size=8), st.binary())
times = st.one_of(
    st.integers(0, 2**64 - 1),
    st.sampled_from([0, 1, 1_700_000_000 * 10**9, MAX_NS - 1, MAX_NS, 2**64 - 1]),
)


def fill_value(target, value) -> None:
    kind, content = value
    if kind == "array_value":
        for item in content:
            fill_value(target.array_value.values.add(), item)
        if not content:
            target.array_value.SetInParent()
    elif kind == "kvlist_value":
        for key, item in content:
            entry = target.kvlist_value.values.add(key=key)
            fill_value(entry.value, item)
        if not content:
            target.kvlist_value.SetInParent()
    elif kind != "empty":
        setattr(target, kind, content)


def fill_attributes(target, pairs) -> None:
    for key, value in pairs:
        fill_value(target.add(key=key).value, value)


@st.composite
def spans(draw):
    span = trace_pb2.Span(
        trace_id=draw(ids16),
        span_id=draw(ids8),
        parent_span_id=draw(st.one_of(st.just(b""), ids8)),
        name=draw(st.one_of(st.sampled_from(SPAN_NAMES), texts)),
        kind=draw(st.integers(-(2**31), 2**31 - 1)),
        start_time_unix_nano=draw(times),
        end_time_unix_nano=draw(times),
    )
    fill_attributes(span.attributes, draw(key_values))
    for _ in range(draw(st.integers(0, 4))):
        event = span.events.add(
            name=draw(st.one_of(st.sampled_from(EVENT_NAMES), texts)),
            time_unix_nano=draw(times),
        )
        fill_attributes(event.attributes, draw(key_values))
    for _ in range(draw(st.integers(0, 2))):
        link = span.links.add(trace_id=draw(ids16), span_id=draw(ids8))
        fill_attributes(link.attributes, draw(st.lists(st.tuples(texts, values), max_size=2)))
    span.status.code = draw(st.integers(-(2**31), 2**31 - 1))
    span.status.message = draw(texts)
    return span


@st.composite
def export_requests(draw):
    request = pb.ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 2))):
        resource_spans = request.resource_spans.add()
        fill_attributes(resource_spans.resource.attributes, draw(key_values))
        for _ in range(draw(st.integers(0, 2))):
            batch = draw(st.lists(spans(), max_size=5))
            if batch and draw(st.booleans()):
                batch.append(batch[0])  # a duplicate within the batch
            resource_spans.scope_spans.add().spans.extend(batch)
    return request


OTLP_KEYS = [
    "resourceSpans",
    "resource_spans",
    "resource",
    "attributes",
    "scopeSpans",
    "scope_spans",
    "spans",
    "traceId",
    "spanId",
    "parentSpanId",
    "name",
    "kind",
    "startTimeUnixNano",
    "endTimeUnixNano",
    "events",
    "timeUnixNano",
    "links",
    "status",
    "code",
    "message",
    "key",
    "value",
    "stringValue",
    "intValue",
    "doubleValue",
    "boolValue",
    "bytesValue",
    "arrayValue",
    "kvlistValue",
    "values",
    "droppedAttributesCount",
]
json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=20),
    st.text(st.characters(codec=None, categories=["Cs", "Cc"]), max_size=4),  # lone surrogates
    st.sampled_from(["0102030405060708", "01" * 16, "", "NaN", "-1", "18446744073709551616"]),
)
json_documents = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(OTLP_KEYS), st.text(max_size=6)), inner, max_size=5
        ),
    ),
    max_leaves=30,
)
