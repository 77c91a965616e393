"""Fuzzes every GET route in the OpenAPI spec with generated query and path parameters.

Values follow each parameter's schema, stray outside it (huge numbers, NaN, text where a
number belongs) or are plain junk; the answer is never a 5xx and always JSON.
"""

import time
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from tests.backend.story import Process, failure_story, load_story

from . import EXAMPLES, FUZZ, TIMEOUT_S, assert_serving, backend_client

pytestmark = pytest.mark.timeout(TIMEOUT_S)

junk = st.text(max_size=30)
numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64]),
)
floats = st.one_of(
    st.floats(), st.sampled_from(["inf", "-inf", "nan", "1e308", "1e-320", "1e400", "0"])
)
BY_TYPE = {
    "integer": st.one_of(numbers, floats, junk),
    "number": st.one_of(floats, numbers, junk),
    "boolean": st.one_of(st.sampled_from(["true", "false", "1", "0", "yes", "on"]), junk),
    "string": st.one_of(junk, st.sampled_from(["running", "finished", "host", "device", "load"])),
}


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    with backend_client(tmp_path_factory.mktemp("rest-fuzz")) as running:
        t0 = time.time_ns()
        for number in range(3):
            scheduler = Process("vllm-engine", f"engine-{number}", "scheduler")
            worker = Process("vllm-worker", f"engine-{number}", "worker")
            load_story(scheduler, worker, None, f"req-{number}", t0 + number * 10**8)
            failure_story(scheduler, worker, f"fail-{number}", t0 + number * 10**8 + 5 * 10**7)
            body = encode_spans(scheduler.spans() + worker.spans()).SerializeToString()
            response = running.post(
                "/v1/traces", content=body, headers={"Content-Type": "application/x-protobuf"}
            )
            assert response.status_code == 200, response.text
        yield running


def get_routes(client) -> list[tuple[str, list[dict]]]:
    spec = client.app.openapi()
    return [
        (path, operations["get"].get("parameters", []))
        for path, operations in sorted(spec["paths"].items())
        if "get" in operations
    ]


def declared_content_type(client, path_template: str) -> str:
    """What the spec says a route's 200 answer is (JSON unless it says otherwise)."""
    answer = client.app.openapi()["paths"][path_template]["get"]["responses"].get("200", {})
    return next(iter(answer.get("content") or {"application/json": {}}))


def schema_type(parameter: dict) -> str:
    schema = parameter.get("schema", {})
    for option in [schema, *schema.get("anyOf", [])]:
        if option.get("type") in BY_TYPE:
            return option["type"]
    return "string"


@st.composite
def calls(draw, routes, request_keys):
    template, parameters = draw(st.sampled_from(routes))
    path, query = template, {}
    for parameter in parameters:
        kind = schema_type(parameter)
        if parameter["in"] == "path":
            value = draw(st.one_of(st.sampled_from(request_keys), BY_TYPE[kind]))
            path = path.replace("{" + parameter["name"] + "}", quote(str(value), safe=""))
        elif draw(st.booleans()):
            query[parameter["name"]] = str(draw(BY_TYPE[kind]))
    return template, path, query


def test_every_get_route_is_fuzzed(client):
    """The spec lists the routes the dashboard reads; a new one is fuzzed without edits."""
    paths = {path for path, _ in get_routes(client)}
    assert {"/api/v1/requests/{request_key}/timeline", "/api/v1/blocks", "/health"} <= paths


@settings(FUZZ, max_examples=4 * EXAMPLES)  # a GET is cheap: four times as many
@given(data=st.data())
def test_generated_parameters_never_fail_the_server(client, data):
    stored = client.get("/api/v1/requests", params={"limit": 10}).json()["items"]
    request_keys = [row["id"] for row in stored] or [1]
    template, path, query = data.draw(calls(get_routes(client), request_keys))
    response = client.get(path, params=query)
    assert response.status_code < 500, (path, query, response.text)
    declared = declared_content_type(client, template)
    if response.status_code == 200:
        assert response.headers["content-type"].startswith(declared), (path, query)
    if declared == "application/json" or response.status_code != 200:
        response.json()


def test_the_server_serves_after_the_fuzzing(client):
    assert_serving(client)
    assert client.get("/api/v1/requests").json()["total"] >= 6  # the seeded stories
