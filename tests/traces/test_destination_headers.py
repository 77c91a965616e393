"""Headers per destination, against real gRPC and HTTP receivers: the backend token goes only to
the kvscope backend, gRPC metadata keys are lower-case, OTEL_EXPORTER_OTLP_HEADERS reach all."""

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kvscope.traces.sdk.configure import _destinations, make_exporter
from kvscope.traces.sdk.exporters import OtlpGrpcExporter
from kvscope.traces.sdk.settings import (
    Destination,
    TracingSettings,
    backend_destination,
    parse_endpoint,
)
from tests.traces.otlp_receivers import WAIT_S, GrpcReceiver, HttpReceiver

TOKEN = "s3cret-backend-token"


@pytest.fixture(autouse=True)
def export_timeout(monkeypatch):
    # Both exporters read their deadline from here (the SDK's gRPC one and our OTLP/HTTP).
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", str(WAIT_S))


@pytest.fixture
def receivers():
    made = []

    def make(kind):
        made.append(kind())
        return made[-1]

    yield make
    for receiver in made:
        receiver.close()


def _spans(count: int = 2):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "kvscope-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for i in range(count):
        provider.get_tracer("kvscope").start_span("kvscope.hook.save_kv_layer", {"i": i}).end()
    return exporter.get_finished_spans()


def _export_to_all(env: dict[str, str]) -> TracingSettings:
    """What configure_tracing does for each destination, then one export to each."""
    settings = TracingSettings.from_env(env)
    for destination in settings.destinations:
        exporter = make_exporter(destination, settings.backend_token)
        assert exporter.export(_spans()) == SpanExportResult.SUCCESS, destination
        exporter.shutdown()
    return settings


def _never_saw_the_token(metadata: dict[str, str]) -> None:
    assert "authorization" not in metadata
    assert not any(TOKEN in value for value in metadata.values()), metadata


def test_grpc_backend_gets_the_token_and_the_other_grpc_destination_never_does(
    receivers, monkeypatch
):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=kv%20scope")
    backend, jaeger = receivers(GrpcReceiver), receivers(GrpcReceiver)
    settings = _export_to_all(
        {
            "KVSCOPE_OTLP_ENDPOINTS": f"{backend.url},{jaeger.url}",
            "KVSCOPE_BACKEND_GRPC_URL": backend.url,
            "KVSCOPE_BACKEND_TOKEN": TOKEN,
        }
    )
    assert [d.is_backend for d in settings.destinations] == [True, False]
    assert backend.metadata()["authorization"] == f"Bearer {TOKEN}"
    assert backend.metadata()["x-tenant"] == "kv scope"
    assert jaeger.metadata()["x-tenant"] == "kv scope"
    _never_saw_the_token(jaeger.metadata())
    assert backend.calls[0][1] == jaeger.calls[0][1] == ["kvscope.hook.save_kv_layer"] * 2


def test_compose_settings_http_backend_with_token_and_grpc_jaeger(receivers, monkeypatch):
    # docker-compose.yml's shape: the backend over OTLP/HTTP with a token, Jaeger over gRPC.
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_HEADERS", raising=False)
    backend, jaeger = receivers(HttpReceiver), receivers(GrpcReceiver)
    _export_to_all(
        {
            "KVSCOPE_OTLP_ENDPOINTS": f"{backend.url},{jaeger.url}",
            "KVSCOPE_BACKEND_URL": backend.url.removesuffix("/v1/traces"),
            "KVSCOPE_BACKEND_TOKEN": TOKEN,
        }
    )
    assert backend.metadata()["authorization"] == f"Bearer {TOKEN}"
    _never_saw_the_token(jaeger.metadata())
    assert len(jaeger.calls[0][1]) == 2


def test_without_a_token_no_destination_gets_authorization(receivers, monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_HEADERS", raising=False)
    backend, jaeger = receivers(GrpcReceiver), receivers(GrpcReceiver)
    _export_to_all(
        {
            "KVSCOPE_OTLP_ENDPOINTS": f"{backend.url},{jaeger.url}",
            "KVSCOPE_BACKEND_GRPC_URL": backend.url,
        }
    )
    for receiver in (backend, jaeger):
        assert "authorization" not in receiver.metadata()
        assert len(receiver.calls[0][1]) == 2


def test_signal_specific_headers_reach_the_standard_grpc_destination(receivers, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-general=no")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "X-Tenant=a,x-Team=b")
    collector = receivers(GrpcReceiver)
    _export_to_all(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url.replace("grpc://", "http://"),
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
            "KVSCOPE_BACKEND_TOKEN": TOKEN,  # no KVSCOPE_BACKEND_URL: nothing is the backend
        }
    )
    metadata = collector.metadata()
    # As the spec orders: the traces variable replaces the general one, it is not merged.
    assert metadata["x-tenant"] == "a" and metadata["x-team"] == "b"
    assert "x-general" not in metadata
    _never_saw_the_token(metadata)


def test_upper_case_keys_given_to_the_grpc_exporter_are_sent_lower_case(receivers):
    # The failure: 'Authorization' made every export fail with "Illegal header key".
    collector = receivers(GrpcReceiver)
    endpoint = collector.url.replace("grpc://", "http://")
    exporter = OtlpGrpcExporter(endpoint=endpoint, insecure=True, headers={"Authorization": "x"})
    assert exporter.export(_spans(1)) == SpanExportResult.SUCCESS
    assert collector.metadata()["authorization"] == "x"
    exporter.shutdown()


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://backend:4318/v1/traces", True),  # the path does not matter
        ("http+json://backend:4318/other", True),  # nor the encoding
        ("http://backend:4317/v1/traces", False),  # another port: another server
        ("https://backend:4318/v1/traces", False),  # another scheme
        ("http://jaeger:4318/v1/traces", False),  # another host
        ("grpc://backend:4318", False),  # gRPC is matched against KVSCOPE_BACKEND_GRPC_URL only
        ("grpc://BACKEND:4317", True),  # host names ignore case
        ("file:///backend/spans.jsonl", False),
    ],
)
def test_the_rule_for_backend_destinations(url, expected):
    backends = [
        Destination("http/protobuf", "http://backend:4318"),
        parse_endpoint("grpc://backend:4317"),
    ]
    assert backend_destination(parse_endpoint(url), backends) is expected


def test_a_destination_named_twice_is_exported_to_once():
    settings = TracingSettings.from_env(
        {
            "KVSCOPE_OTLP_ENDPOINTS": "http://backend:4318/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://backend:4318/v1/traces",
        }
    )
    assert settings.destinations == (Destination("http/protobuf", "http://backend:4318/v1/traces"),)


def test_joining_vllms_provider_leaves_the_standard_endpoint_to_vllms_exporter():
    # vLLM writes its --otlp-traces-endpoint to OTEL_EXPORTER_OTLP_TRACES_ENDPOINT and exports
    # every span of its provider there, ours included.
    settings = TracingSettings.from_env(
        {
            "KVSCOPE_OTLP_ENDPOINTS": "http://backend:4318/v1/traces",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://jaeger:4317",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        }
    )
    assert len(_destinations(settings, joined=False)) == 2
    assert _destinations(settings, joined=True) == [settings.destinations[0]]
