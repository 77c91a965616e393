"""docker-compose.yml, .env and the Prometheus / Grafana files as compose reads them, for the
tests that check them without Docker."""

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
GPU_OVERRIDE = ROOT / "docker-compose.gpu.yml"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "kvscope.json"
ENGINES = ("prefill", "decode")
_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def read_env_file() -> dict[str, str]:
    lines = (ROOT / ".env").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def interpolate(node, env: dict[str, str]):
    """Compose's ${VAR} and ${VAR:-default} substitution, applied to every string."""
    if isinstance(node, dict):
        return {key: interpolate(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate(value, env) for value in node]
    if not isinstance(node, str):
        return node

    def substitute(match: re.Match) -> str:
        name, default = match.groups()
        if name not in env and default is None:
            raise AssertionError(f"${{{name}}} is used but not defined in .env")
        return env.get(name) or default or ""

    return _VARIABLE.sub(substitute, node)


def load_services(env: dict[str, str]) -> dict[str, dict]:
    """docker-compose.yml's services, with .env substituted."""
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env)["services"]


def command_of(services: dict, name: str) -> list[str]:
    command = services[name]["command"]
    assert isinstance(command, list), f"{name}: give the command as a list (no shell parsing)"
    return [str(arg) for arg in command]


def option(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def published(service: dict) -> dict[int, int]:
    """{container port: host port}."""
    pairs = (str(entry).rsplit(":", 1) for entry in service.get("ports", []))
    return {int(inner): int(outer) for outer, inner in pairs}


def dashboard_metrics() -> set[str]:
    """Every metric name the Grafana dashboard's queries read."""
    exprs = " ".join(
        t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]
    )
    return set(re.findall(r"\b((?:vllm:|kvscope_)[a-z0-9_:]+)\b", exprs))
