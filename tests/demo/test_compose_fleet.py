"""docker-compose.fleet.yml checked without Docker: two backends on one database behind a
Collector that load-balances by trace id, and every engine sending its spans there."""

import yaml

from kvscope.backend.settings import Settings
from kvscope.cli.main import build_parser
from kvscope.traces.sdk.settings import TracingSettings
from tests.demo.compose_files import COMPOSE, ROOT, command_of, interpolate
from tests.demo.test_compose import FOREIGN_ENV, known_env_names

FLEET = ROOT / "docker-compose.fleet.yml"
COLLECTOR = ROOT / "deploy" / "otel-collector" / "fleet.yaml"
SENDERS = ("prefill", "decode", "proxy")


def _merge(base: dict, override: dict) -> dict:
    """Compose's merge of an override file for what these files use: mappings merge key by
    key, anything else the override replaces."""
    merged = dict(base)
    for key, value in override.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = _merge(base[key], value) if both else value
    return merged


def _services(env_file) -> dict[str, dict]:
    files = [interpolate(yaml.safe_load(path.read_text()), env_file) for path in (COMPOSE, FLEET)]
    return _merge(*files)["services"]


def _collector() -> dict:
    return yaml.safe_load(COLLECTOR.read_text())


def test_the_collector_balances_by_trace_id_over_every_backend(env_file):
    services = _services(env_file)
    backends = sorted(name for name in services if name.startswith("backend"))
    assert backends == ["backend", "backend-2"]
    balancing = _collector()["exporters"]["loadbalancing"]
    assert balancing["routing_key"] == "traceID"
    grpc_port = Settings.model_fields["grpc_port"].default  # the backends' OTLP/gRPC receiver
    assert balancing["resolver"]["static"]["hostnames"] == [f"{b}:{grpc_port}" for b in backends]
    headers = balancing["protocol"]["otlp"]["headers"]
    assert headers["authorization"] == "Bearer ${env:KVSCOPE_BACKEND_TOKEN}"
    collector = services["otel-collector"]
    assert collector["environment"]["KVSCOPE_BACKEND_TOKEN"] == env_file["KVSCOPE_BACKEND_TOKEN"]
    (mount,) = collector["volumes"]
    source, target, _ = mount.split(":")
    assert (ROOT / source).resolve() == COLLECTOR and collector["command"] == [f"--config={target}"]
    pipeline = _collector()["service"]["pipelines"]["traces"]
    assert pipeline["receivers"] == ["otlp"] and pipeline["exporters"] == ["loadbalancing"]
    assert set(collector["depends_on"]) == set(backends)


def test_both_backends_run_the_same_backend_on_one_database(env_file):
    services = _services(env_file)
    first, second = services["backend"], services["backend-2"]
    assert command_of(services, "backend") == command_of(services, "backend-2")
    args = build_parser().parse_args(command_of(services, "backend-2")[1:])
    assert args.command == "backend" and args.grpc_port is None  # the default, 4317
    assert first["environment"]["DATABASE_URL"] == second["environment"]["DATABASE_URL"]
    assert "${DATABASE_URL}" in FLEET.read_text()
    assert second["image"] == first["image"] and second["healthcheck"] == first["healthcheck"]
    assert second["environment"]["OTEL_SERVICE_NAME"] != first["environment"]["OTEL_SERVICE_NAME"]
    assert second["depends_on"]["backend"]["condition"] == "service_healthy"


def test_every_engine_sends_its_spans_to_the_collector_without_the_token(env_file):
    http = _collector()["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    collector = f"http://otel-collector:{http.rsplit(':', 1)[1]}/v1/traces"
    services = _services(env_file)
    for name in SENDERS:
        settings = TracingSettings.from_env(services[name]["environment"])
        marked = {d.endpoint: d.is_backend for d in settings.destinations}
        assert marked[collector] is False, name  # the collector adds the token itself
        assert all(not is_backend for is_backend in marked.values()), name


def test_every_environment_name_of_the_fleet_is_read_by_kvscope_or_its_image(env_file):
    known = known_env_names() | FOREIGN_ENV
    services = _services(env_file)
    for name in ("backend-2", "otel-collector", *SENDERS):
        unknown = set(services[name].get("environment", {})) - known
        assert not unknown, f"{name}: no settings code reads {sorted(unknown)}"
