"""Fuzzes POST /v1/traces: odd but well-formed OTLP, mutated bytes, garbage and odd JSON.

Whatever arrives, the answer is never a 5xx, the backend keeps serving, and every span of
an accepted batch is stored: a 200 counts exactly the spans OTLP's rules reject.
"""

import base64
import gzip
import json

import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
from sqlalchemy import text

from kvscope.backend.ingest.bound import Limits, SpanChecker
from kvscope.backend.ingest.decode import attributes_of

from . import EXAMPLES, FUZZ, TIMEOUT_S, assert_serving, backend_client
from .otlp_strategies import MAX_NS, export_requests, json_documents, spans

pytestmark = pytest.mark.timeout(TIMEOUT_S)

PROTOBUF, JSON = "application/x-protobuf", "application/json"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with backend_client(tmp_path_factory.mktemp("otlp-fuzz")) as running:
        yield running


# --- checks ------------------------------------------------------------------------------------


def spec_rejects(span) -> bool:
    """OTLP's id rules plus kvscope's documented ones: a name, end >= start, before 2262."""
    return (
        len(span.trace_id) != 16
        or span.trace_id == bytes(16)
        or len(span.span_id) != 8
        or span.span_id == bytes(8)
        or (span.parent_span_id and len(span.parent_span_id) != 8)
        or not span.name
        or span.end_time_unix_nano >= MAX_NS
        or span.end_time_unix_nano < span.start_time_unix_nano
    )


def all_spans(request):
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def stored_keys(client, keys: set) -> set:
    found = set()
    with client.app.state.engine.connect() as connection:
        for trace_id in {t for t, _ in keys}:
            rows = connection.execute(
                text("SELECT trace_id, span_id FROM span WHERE trace_id = :t"), {"t": trace_id}
            )
            found.update((row.trace_id, row.span_id) for row in rows)
    return found & keys


def check_answer(client, request, response, content_type: str, empty_body=False) -> None:
    """The status and the counts a client sees match what was sent, and nothing is lost."""
    assert response.status_code < 500, response.text
    sent = all_spans(request)
    rejected = [s for s in sent if spec_rejects(s)]
    accepted = {(s.trace_id.hex(), s.span_id.hex()) for s in sent if not spec_rejects(s)}
    if not request.resource_spans:  # an empty export is fine; other messages are not
        assert response.status_code == (200 if empty_body else 400), response.text
        return
    if rejected and not accepted:
        assert response.status_code == 400, response.text
        assert f"all {len(rejected)} spans rejected" in error_message(response, content_type)
        return
    assert response.status_code == 200, response.text
    partial = parse_answer(response, content_type).partial_success
    assert partial.rejected_spans == len(rejected)
    missing = accepted - stored_keys(client, accepted)
    assert not missing, f"accepted spans not stored: {sorted(missing)[:3]}"


def parse_answer(response, content_type: str):
    if content_type == PROTOBUF:
        return pb.ExportTraceServiceResponse.FromString(response.content)
    return json_format.ParseDict(response.json(), pb.ExportTraceServiceResponse())


def error_message(response, content_type: str) -> str:
    if content_type == PROTOBUF:
        return status_pb2.Status.FromString(response.content).message
    return response.json()["message"]


def as_json(request) -> bytes:
    """OTLP/JSON as exporters write it: camelCase, ids in hex."""
    document = json_format.MessageToDict(request)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for obj in [span, *span.get("links", [])]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in obj:
                            obj[key] = base64.b64decode(obj[key]).hex()
    return json.dumps(document).encode()


def post(client, body: bytes, content_type: str, compress: bool = False):
    headers = {"Content-Type": content_type}
    if compress:
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    return client.post("/v1/traces", content=body, headers=headers)


# --- tests -------------------------------------------------------------------------------------


@FUZZ
@given(request=export_requests(), encoding=st.sampled_from([PROTOBUF, JSON]), zipped=st.booleans())
def test_odd_but_well_formed_otlp_is_stored_or_refused_span_by_span(
    client, request, encoding, zipped
):
    body = request.SerializeToString() if encoding == PROTOBUF else as_json(request)
    response = post(client, body, encoding, zipped)
    if response.status_code == 413:
        return  # over the (small) body limit: refused whole, with a reason
    check_answer(client, request, response, encoding)
    assert_serving(client)


@FUZZ
@given(request=export_requests(), data=st.data())
def test_mutated_and_truncated_protobuf_never_fails_the_server(client, request, data):
    body = bytearray(request.SerializeToString())
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(body)))
        action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
        if action == "flip" and position < len(body):
            body[position] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del body[position:]
        elif action == "insert":
            body[position:position] = data.draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del body[position : position + data.draw(st.integers(1, 8))]
    response = post(client, bytes(body), PROTOBUF, data.draw(st.booleans()))
    try:
        parsed = pb.ExportTraceServiceRequest.FromString(bytes(body))
    except Exception as error:  # noqa: BLE001 (any parse failure): the server must refuse it
        if "UTF-8" not in str(error):
            assert response.status_code == 400, response.text
        # Invalid UTF-8 in a string field: the backend repairs it (U+FFFD, counted in the
        # partial-success message) when nothing else is wrong with the body, else refuses it.
        elif response.status_code != 400:
            assert response.status_code == 200 and "U+FFFD" in response.text, response.text
    else:
        if response.status_code != 413:
            check_answer(client, parsed, response, PROTOBUF, empty_body=not body)
        assert response.status_code < 500, response.text
    assert_serving(client)


@settings(FUZZ, max_examples=2 * EXAMPLES)  # cheap cases: twice as many
@given(document=json_documents, zipped=st.booleans())
def test_odd_json_documents_get_a_clear_answer(client, document, zipped):
    body = json.dumps(document, allow_nan=True).encode()
    response = post(client, body, JSON, zipped)
    assert response.status_code in (200, 400), response.text
    assert response.headers["content-type"].startswith(JSON)
    assert response.json() is not None
    assert_serving(client)


@settings(FUZZ, max_examples=2 * EXAMPLES)
@given(
    body=st.binary(max_size=2048),
    content_type=st.sampled_from([PROTOBUF, JSON, "text/plain", "", PROTOBUF + "; charset=x"]),
    encoding=st.sampled_from(["", "gzip", "deflate", "identity", "br", "GZIP"]),
)
def test_garbage_bodies_and_headers_get_a_4xx(client, body, content_type, encoding):
    headers = {"Content-Type": content_type, "Content-Encoding": encoding}
    response = client.post("/v1/traces", content=body, headers=headers)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        assert response.content, "an error must say what is wrong"
    assert_serving(client)


@pytest.mark.parametrize(
    "body",
    [
        b"[" * 200_000,
        b'{"resourceSpans": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}]}]}]})
        .encode()
        .replace(b'"x"', b'"\\ud800"'),
    ],
    ids=["deep-array", "deep-resource-spans", "lone-surrogate-name"],
)
def test_pathological_json_is_refused_cleanly(client, body):
    response = post(client, body, JSON)
    assert response.status_code == 400, response.text
    assert_serving(client)


def test_everything_fuzzed_in_can_be_read_back(client):
    """After the fuzzing above, every read route works over what was stored."""
    spec = client.app.openapi()
    plain = [p for p, ops in spec["paths"].items() if "get" in ops and "{" not in p]
    for path in plain:
        response = client.get(path)
        assert response.status_code == 200, (path, response.text)
    page = client.get("/api/v1/requests", params={"limit": 1000}).json()
    for request in page["items"]:
        for tail in ("", "/timeline", "/spans"):
            response = client.get(f"/api/v1/requests/{request['id']}{tail}")
            assert response.status_code == 200, (request, tail, response.text)
    assert_serving(client)


@FUZZ
@given(
    span=spans(),
    limits=st.sampled_from(
        [
            Limits(),
            Limits(max_attribute_value_bytes=160, max_attribute_array_len=8),
            Limits(max_attribute_value_bytes=4096, max_attribute_array_len=6),
        ]
    ),
)
def test_bounded_cuts_exactly_what_is_over_a_limit(span, limits):
    """bounded's quick exits (short texts and numbers only, lists of integers) return a span's
    attributes untouched exactly when no value is over a limit, and cut them otherwise."""
    checker = SpanChecker(limits)
    for key_values in [span.attributes, *(event.attributes for event in span.events)]:
        attributes = attributes_of(key_values)
        within = len(attributes) <= limits.max_attributes_per_span and all(
            _within(value, limits) for value in attributes.values()
        )
        assert (checker.bounded(dict(attributes), span.name) == attributes) == within


def _within(value, limits: Limits) -> bool:
    if isinstance(value, str):
        return len(value.encode()) <= limits.max_attribute_value_bytes
    if isinstance(value, list):
        return len(value) <= limits.max_attribute_array_len and all(
            _within(item, limits) for item in value
        )
    if isinstance(value, dict):
        return len(str(value)) <= limits.max_attribute_value_bytes
    return True
