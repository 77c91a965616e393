"""Tracing settings read from the standard OTEL_* variables plus kvscope's own KVSCOPE_* ones."""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

LAYER_MODES = ("aggregated", "per_layer")


@dataclass(frozen=True)
class Destination:
    """One place spans go: protocol 'http/protobuf', 'http/json', 'grpc' or 'file'.

    `is_backend`: this is the kvscope backend, the only destination given KVSCOPE_BACKEND_TOKEN
    (see backend_destination). `standard`: it came from OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT.
    """

    protocol: str
    endpoint: str
    is_backend: bool = False
    standard: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class TracingSettings:
    """What set-up needs; from_env() reads it the way OpenTelemetry users expect."""

    enabled: bool = True
    service_name: str | None = None
    destinations: tuple[Destination, ...] = field(default_factory=tuple)
    max_queue_size: int = 4096
    max_batch_size: int = 512
    schedule_delay_s: float = 0.5
    layer_mode: str = "aggregated"
    backend_token: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TracingSettings":
        env = os.environ if env is None else env
        layer_mode = env.get("KVSCOPE_LAYER_SPANS", "aggregated")
        if layer_mode not in LAYER_MODES:
            raise ValueError(f"KVSCOPE_LAYER_SPANS={layer_mode!r}: use one of {LAYER_MODES}")
        return cls(
            enabled=env.get("OTEL_SDK_DISABLED", "false").lower() != "true"
            and env.get("KVSCOPE_TRACING", "on").lower() not in ("off", "0", "false"),
            service_name=env.get("OTEL_SERVICE_NAME") or None,
            destinations=tuple(_mark_backend(_destinations(env), env)),
            max_queue_size=int(env.get("OTEL_BSP_MAX_QUEUE_SIZE", 4096)),
            max_batch_size=int(env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)),
            schedule_delay_s=int(env.get("OTEL_BSP_SCHEDULE_DELAY", 500)) / 1000,
            layer_mode=layer_mode,
            backend_token=env.get("KVSCOPE_BACKEND_TOKEN") or None,
        )


def _destinations(env: Mapping[str, str]) -> list[Destination]:
    """KVSCOPE_OTLP_ENDPOINTS (several, comma-separated), the standard OTLP endpoint, a file."""
    found: list[Destination] = []
    for url in filter(None, (u.strip() for u in env.get("KVSCOPE_OTLP_ENDPOINTS", "").split(","))):
        found.append(parse_endpoint(url))
    standard = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or _base_endpoint(env)
    if standard and env.get("OTEL_TRACES_EXPORTER", "otlp") != "none":
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
            "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
        )
        found.append(Destination(protocol, standard, standard=True))
    if path := env.get("KVSCOPE_TRACES_FILE"):
        found.append(Destination("file", path))
    # The same place named twice (say in KVSCOPE_OTLP_ENDPOINTS and the standard variable) would
    # get every span twice.
    return [d for i, d in enumerate(found) if d not in found[:i]]


def _mark_backend(found: list[Destination], env: Mapping[str, str]) -> list[Destination]:
    backends = []
    if url := env.get("KVSCOPE_BACKEND_URL", "").strip():
        backends.append(Destination("http/protobuf", url))
    if url := env.get("KVSCOPE_BACKEND_GRPC_URL", "").strip():
        backends.append(parse_endpoint(url))
    return [replace(d, is_backend=backend_destination(d, backends)) for d in found]


def _server(destination: Destination) -> tuple[str, str, str, int] | None:
    """(transport, scheme, host, port): what a destination is, whatever its path."""
    if destination.protocol == "file":
        return None
    transport = "grpc" if destination.protocol == "grpc" else "http"
    endpoint = destination.endpoint
    url = urlsplit(endpoint if "://" in endpoint else "http://" + endpoint)
    try:
        port = url.port or (443 if url.scheme == "https" else 80)
    except ValueError:  # a port that is not a number names no server
        return None
    return transport, url.scheme, (url.hostname or "").lower(), port


def backend_destination(destination: Destination, backends: list[Destination]) -> bool:
    """The rule for the kvscope backend: a destination is it when its transport (HTTP or gRPC),
    scheme, host and port equal those of KVSCOPE_BACKEND_URL (OTLP/HTTP, path ignored) or of
    KVSCOPE_BACKEND_GRPC_URL (`grpc://host:port`). Nothing else ever gets the backend's token:
    not Jaeger, not a collector on the same host under another port."""
    server = _server(destination)
    return server is not None and any(server == _server(b) for b in backends)


def _base_endpoint(env: Mapping[str, str]) -> str | None:
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not base:
        return None
    protocol = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    # The spec: for HTTP the base endpoint gets /v1/traces appended; gRPC takes it as it is.
    return base if protocol == "grpc" else base.rstrip("/") + "/v1/traces"


def parse_endpoint(url: str) -> Destination:
    """'grpc://host:4317' -> gRPC; 'http(s)://host:port/path' -> OTLP/HTTP protobuf;
    'http+json://...' -> OTLP/HTTP JSON; 'file:///path' -> OTLP/JSON lines in a file."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(
            f"OTLP endpoint {url!r} needs a scheme: grpc://, http://, https://, file://"
        )
    if scheme == "grpc":
        return Destination("grpc", "http://" + rest)
    if scheme in ("http", "https"):
        return Destination("http/protobuf", url)
    if scheme in ("http+json", "https+json"):
        return Destination("http/json", scheme.removesuffix("+json") + "://" + rest)
    if scheme == "file":
        return Destination("file", rest)
    raise ValueError(f"OTLP endpoint {url!r}: unknown scheme {scheme!r}")
