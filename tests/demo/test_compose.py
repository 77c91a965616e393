"""docker-compose.yml checked without Docker: schema, image, commands, ports and env vs the code."""

import json
import re
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvscope.backend.settings import Settings, check_bind_is_safe
from kvscope.cli.main import build_parser
from kvscope.connector.p2p.config import HOST_ENV, PORT_ENV, P2PConfig
from kvscope.dashboard.settings import DashboardSettings
from kvscope.demo import workload_cli
from kvscope.harness.configs import demo_config
from kvscope.harness.engine import ENGINE_ENV, serve_command
from kvscope.traces.sdk.settings import TracingSettings, parse_endpoint
from tests.demo.compose_files import (
    COMPOSE,
    ENGINES,
    GPU_OVERRIDE,
    ROOT,
    command_of,
    interpolate,
    option,
    published,
)

JAEGER_GRPC = "http://jaeger:4317"
SIDE_CHANNEL_PORT = 5700
FAULTS_FILE = Path("/faults/faults.json")
# Engine settings compose changes on purpose: containers share neither loopback nor memory.
ENGINE_ENV_OVERRIDES = {"UCX_NET_DEVICES"}
# Variables read by third-party code, not by kvscope's settings modules.
FOREIGN_ENV = {
    "COLLECTOR_OTLP_ENABLED",  # Jaeger
    "POSTGRES_USER",
    "POSTGRES_DB",
    "POSTGRES_PASSWORD",  # the postgres image
    "UCX_TLS",  # UCX, under NIXL
    "GF_SECURITY_ADMIN_PASSWORD",
    "GF_AUTH_ANONYMOUS_ENABLED",
    "GF_AUTH_ANONYMOUS_ORG_ROLE",
    "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH",  # Grafana
}


def test_every_service_has_an_image_or_a_build_that_exists(services):
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        if build := service.get("build"):
            context = ROOT / build["context"]
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name


def test_the_image_installs_what_setup_installs():
    dockerfile = (ROOT / "Dockerfile").read_text()
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    for name in ("VLLM_VERSION", "TORCH_CPU_VERSION", "NIXL_VERSION"):
        version = re.search(rf"^{name}=(\S+)$", setup, re.M).group(1)
        assert f"ARG {name}={version}" in dockerfile, f"Dockerfile's {name} differs from setup.sh"
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    assert "torchvision torchaudio torchcodec triton" in dockerfile


def test_long_running_services_have_health_checks(services):
    for name, service in services.items():
        if service.get("restart") == "no":  # a one-shot client
            assert "ports" not in service, f"{name} serves ports: give it a health check"
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name} has no health check"


def test_depends_on_waits_for_healthy_services(services):
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert condition["condition"] == "service_healthy", f"{name} -> {dependency}"
            assert "healthcheck" in services[dependency], f"{dependency} has no health check"


def test_env_file_keys_are_all_used(env_file):
    text = "".join(path.read_text() for path in ROOT.glob("docker-compose*.yml"))
    # COMPOSE_* keys (COMPOSE_PROFILES, ...) are read by compose itself.
    unused = [key for key in env_file if "${" + key not in text and not key.startswith("COMPOSE_")]
    assert not unused, f".env keys no compose file uses: {unused}"


def test_every_variable_in_every_compose_file_is_defined(env_file):
    for path in ROOT.glob("docker-compose*.yml"):
        interpolate(yaml.safe_load(path.read_text()), env_file)


def known_env_names() -> set[str]:
    """Variables kvscope's settings code reads (pydantic names, then literal names)."""
    names = set(ENGINE_ENV) | {HOST_ENV, PORT_ENV}
    for settings in (Settings, DashboardSettings):
        prefix = settings.model_config["env_prefix"]
        for field_name, field in settings.model_fields.items():
            alias = field.validation_alias
            names.add(alias if isinstance(alias, str) else (prefix + field_name).upper())
    for module in ("traces/sdk/settings.py", "traces/sdk/configure.py"):
        names |= set(re.findall(r'"((?:OTEL|KVSCOPE)_[A-Z_]+)"', (ROOT / module).read_text()))
    return names


def test_environment_names_exist_in_the_settings_code(services):
    known = known_env_names() | FOREIGN_ENV
    for name, service in services.items():
        unknown = set(service.get("environment", {})) - known
        assert not unknown, f"{name}: no settings code reads {sorted(unknown)}"


def test_every_service_names_itself_for_tracing(services):
    for name, service in services.items():
        if service.get("build"):
            assert service["environment"]["OTEL_SERVICE_NAME"], name


def test_backend_command_and_settings_agree_with_compose(services, env_file, monkeypatch):
    backend = services["backend"]
    args = build_parser().parse_args(command_of(services, "backend")[1:])
    assert args.command == "backend" and args.port is None
    for key, value in backend["environment"].items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.port == int(env_file["KVSCOPE_BACKEND_PORT"])
    assert settings.token, "binding beyond loopback needs KVSCOPE_BACKEND_TOKEN"
    # .env ships a placeholder, which the backend refuses beyond loopback until it is changed.
    with pytest.raises(SystemExit, match="placeholder"):
        check_bind_is_safe(settings, args.host)
    check_bind_is_safe(settings.model_copy(update={"token": "a-secret-of-your-own"}), args.host)
    assert settings.port in published(backend)
    assert f":{settings.port}/health" in backend["healthcheck"]["test"][-1]
    assert settings.database_url.startswith("sqlite:////data/")
    assert "/data" in " ".join(backend["volumes"])


def backend_url(env_file) -> str:
    return f"http://backend:{env_file['KVSCOPE_BACKEND_PORT']}"


def test_dashboard_command_reads_the_backend(services, env_file, monkeypatch):
    args = build_parser().parse_args(command_of(services, "dashboard")[1:])
    assert args.command == "dashboard" and args.backend == backend_url(env_file)
    assert args.port in published(services["dashboard"])
    assert f":{args.port}/_stcore/health" in services["dashboard"]["healthcheck"]["test"][-1]
    for key, value in services["dashboard"]["environment"].items():
        monkeypatch.setenv(key, value)
    settings = DashboardSettings()
    assert settings.backend_token == env_file["KVSCOPE_BACKEND_TOKEN"]
    assert settings.jaeger_url.endswith(f":{env_file['JAEGER_UI_PORT']}")


def test_proxy_command_starts_the_proxy(services, env_file, monkeypatch):
    argv = command_of(services, "proxy")
    assert argv[:3] == ["python", "-m", "kvscope.harness.proxy"]
    served = {}
    monkeypatch.setattr(sys, "argv", ["proxy", *argv[3:]])
    monkeypatch.setattr("uvicorn.run", lambda app, **kwargs: served.update(app=app, **kwargs))
    runpy.run_module("kvscope.harness.proxy", run_name="__main__")
    assert served["host"] == "0.0.0.0" and served["port"] in published(services["proxy"])
    assert option(argv, "--prefill-url") == f"http://prefill:{env_file['PREFILL_PORT']}"
    assert option(argv, "--decode-url") == f"http://decode:{env_file['DECODE_PORT']}"


def test_only_the_backend_gets_the_token(services, env_file):
    environment = services["proxy"]["environment"]
    settings = TracingSettings.from_env(environment)
    marked = {d.endpoint: d.is_backend for d in settings.destinations}
    assert marked == {backend_url(env_file) + "/v1/traces": True, JAEGER_GRPC: False}
    assert parse_endpoint(environment["KVSCOPE_BACKEND_URL"]).endpoint == backend_url(env_file)
    assert settings.backend_token == env_file["KVSCOPE_BACKEND_TOKEN"]


def test_workload_command_parses_and_targets_the_proxy(services, env_file):
    argv = command_of(services, "workload")
    assert argv[:3] == ["python", "-m", "kvscope.demo.workload_cli"]
    args = workload_cli.build_parser().parse_args(argv[3:])
    assert args.target == f"http://proxy:{env_file['PROXY_PORT']}"
    assert args.faults_file == str(FAULTS_FILE)
    assert {"proxy"} <= set(services["workload"]["depends_on"])


def model_path() -> Path:
    match = re.search(r"KVSCOPE_MODEL=(\S+)", (ROOT / "Dockerfile").read_text())
    return Path(match.group(1))


@pytest.mark.parametrize("role", ENGINES)
def test_engine_command_is_the_demos_serve_command(services, env_file, role):
    argv = command_of(services, role)
    port = int(env_file[f"{role.upper()}_PORT"])
    expected = serve_command(model_path(), port, demo_config(SIDE_CHANNEL_PORT, FAULTS_FILE))
    expected[0] = "python"  # the image's interpreter
    expected[expected.index("--host") + 1] = "0.0.0.0"
    config_at = expected.index("--kv-transfer-config") + 1
    assert json.loads(argv[config_at]) == json.loads(expected[config_at]), "engine_config changed"
    assert argv[:config_at] == expected[:config_at]
    # vLLM's own exporter goes to Jaeger (the demo's goes to its backend, which has no token):
    # it can only be given the backend's token through variables every destination reads.
    assert argv[config_at + 1 :] == [
        "--otlp-traces-endpoint",
        JAEGER_GRPC,
        "--served-model-name",
        "kvscope-tiny",
    ]
    assert f":{port}/health" in services[role]["healthcheck"]["test"][-1]


@pytest.mark.parametrize("role", ENGINES)
def test_engine_environment_matches_the_demos(services, env_file, role, monkeypatch):
    environment = services[role]["environment"]
    for key, value in ENGINE_ENV.items():
        if key not in ENGINE_ENV_OVERRIDES:
            assert environment.get(key) == value, f"{role}: {key} differs from ENGINE_ENV"
    # As vLLM leaves it once it set up its own exporter (to Jaeger, over gRPC).
    tracing_env = {**environment, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": JAEGER_GRPC}
    settings = TracingSettings.from_env(tracing_env)
    assert settings.backend_token == env_file["KVSCOPE_BACKEND_TOKEN"]
    assert {(d.protocol, d.endpoint, d.is_backend) for d in settings.destinations} == {
        ("http/protobuf", backend_url(env_file) + "/v1/traces", True),
        ("grpc", JAEGER_GRPC, False),  # vLLM's exporter's: kvscope joins it, adds none
    }
    assert not any(key.endswith("_HEADERS") for key in environment), "headers reach Jaeger too"
    monkeypatch.setenv(HOST_ENV, environment[HOST_ENV])
    extra = demo_config(SIDE_CHANNEL_PORT, FAULTS_FILE)["kv_connector_extra_config"]
    p2p = P2PConfig.from_extra_config(extra["connectors"][0]["kv_connector_extra_config"])
    assert p2p.side_channel_host == role, "peers must reach the side channel by service name"
    assert "faults:/faults" in services[role]["volumes"]


def test_vllm_accepts_the_engine_arguments(services):
    pytest.importorskip("vllm")
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
    except ImportError:  # vLLM 0.33 moved it
        from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    for role in ENGINES:
        args = parser.parse_args(command_of(services, role)[3:])
        assert args.kv_transfer_config.kv_connector == "KvscopeMultiConnector"
        assert args.served_model_name == ["kvscope-tiny"] and args.block_size == 32


def test_gpu_override_gives_the_engines_gpus(services):
    override = yaml.safe_load(GPU_OVERRIDE.read_text())["services"]
    assert set(override) == set(ENGINES) and set(override) <= set(services)
    for service in override.values():
        assert service["image"] == "kvscope:cuda"
        assert service["build"]["args"]["KVSCOPE_DEVICE"] == "cuda"
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_postgres_is_optional_and_the_backend_waits_for_it(services):
    assert services["postgres"]["profiles"] == ["postgres"]
    assert services["backend"]["depends_on"]["postgres"]["required"] is False


def test_docker_compose_config_accepts_the_files():
    docker = shutil.which("docker")
    version = docker and subprocess.run([docker, "compose", "version"], capture_output=True)
    if not version or version.returncode != 0:
        pytest.skip(
            "no `docker compose` here (PLATFORM.md: no Docker engine); schema checked above"
        )
    fleet = [
        "-f",
        str(COMPOSE),
        "-f",
        str(ROOT / "docker-compose.fleet.yml"),
        "--profile",
        "postgres",
    ]
    for files in (["-f", str(COMPOSE)], ["-f", str(COMPOSE), "-f", str(GPU_OVERRIDE)], fleet):
        result = subprocess.run(
            [docker, "compose", *files, "config", "--quiet"], cwd=ROOT, capture_output=True
        )
        assert result.returncode == 0, result.stderr.decode()
