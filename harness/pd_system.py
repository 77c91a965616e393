"""The traced P/D system the demo and the soak run: backend, dashboard, two vLLM servers, proxy."""

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.demo.stack import Service, Stack
from kvscope.harness.engine import engine_env, free_port, serve_command

SERVERS = ("prefill", "decode")
"""The servers' roles, in the order they are started and the proxy names them."""
NUM_DEVICE_BLOCKS = 64
"""A small KV cache per server: vLLM's prefix cache evicts and the offload pool gets hits."""
SERVED_MODEL_NAME = "kvscope-tiny"


def python(*args: str) -> list[str]:
    """A command running a module with this interpreter."""
    return [sys.executable, "-m", *args]


def traced_serve_args(backend_url: str) -> list[str]:
    """`vllm serve` flags for a server whose own request spans go to the backend."""
    return ["--otlp-traces-endpoint", backend_url + "/v1/traces"]


def traced_env(backend_url: str, service_name: str, otlp_endpoint: str | None = None) -> dict:
    """The environment giving a process's spans to the backend (and to otlp_endpoint too)."""
    endpoints = ",".join(filter(None, [backend_url + "/v1/traces", otlp_endpoint]))
    return {
        "KVSCOPE_OTLP_ENDPOINTS": endpoints,
        "KVSCOPE_BACKEND_URL": backend_url,
        "OTEL_SERVICE_NAME": service_name,
    }


@dataclass(frozen=True)
class PDSystemConfig:
    """What differs between the systems that run: the engines' connector config, ports, extras."""

    model: Path
    workdir: Path
    engine_config: Callable[[int], dict]
    """A server's KV transfer config, given the side-channel port it may listen on."""
    backend_port: int = 0  # 0: a free port
    proxy_port: int = 0
    dashboard_port: int | None = None  # None: no dashboard
    otlp_endpoint: str | None = None  # another destination for every span, e.g. Jaeger
    role_env: Callable[[str], Mapping[str, str]] = field(default=lambda role: {})
    """More environment for the server of each role."""
    default_executor: bool = False
    """The servers as vLLM runs them by default (engine core and model worker in processes of
    their own) instead of with kvscope's VLLM_ENABLE_V1_MULTIPROCESSING=0."""
    num_device_blocks: int = NUM_DEVICE_BLOCKS
    timeout_s: float = 300


@dataclass
class PDSystem:
    """The running services' URLs by name (backend, dashboard, prefill, decode, proxy)."""

    urls: dict[str, str]
    stack: Stack


def start_pd_system(config: PDSystemConfig, stack: Stack) -> PDSystem:
    """Backend (SQLite in the workdir), the dashboard if asked, the prefill and decode servers
    (started together: two vLLM servers start in about the time of one), then the proxy.
    Every service joins `stack`, which stops them all whatever happens."""
    config.workdir.mkdir(parents=True, exist_ok=True)
    backend_port = config.backend_port or free_port()
    backend = f"http://127.0.0.1:{backend_port}"
    database = {"DATABASE_URL": f"sqlite:///{config.workdir / 'kvscope.db'}"}
    cmd = python("kvscope.cli.main", "backend", "--port", str(backend_port))
    stack.start(service(config, "backend", cmd, database, backend + "/health"), config.timeout_s)
    urls = {"backend": backend}
    if config.dashboard_port is not None:
        dashboard = f"http://127.0.0.1:{config.dashboard_port}"
        cmd = python(
            "kvscope.dashboard", "--port", str(config.dashboard_port), "--backend-url", backend
        )
        health = dashboard + "/_stcore/health"
        stack.start(service(config, "dashboard", cmd, {}, health), config.timeout_s)
        urls["dashboard"] = dashboard
    servers = []
    for role in SERVERS:
        urls[role] = f"http://127.0.0.1:{(port := free_port())}"
        servers.append(server(config, role, port, backend))
    stack.start_together(servers, config.timeout_s)
    proxy_port = config.proxy_port or free_port()
    urls["proxy"] = f"http://127.0.0.1:{proxy_port}"
    cmd = python(
        "kvscope.harness.proxy",
        "--port",
        str(proxy_port),
        "--prefill-url",
        urls["prefill"],
        "--decode-url",
        urls["decode"],
    )
    proxy_env = traced_env(backend, "kvscope-proxy", config.otlp_endpoint)
    health = urls["proxy"] + "/health"
    stack.start(service(config, "proxy", cmd, proxy_env, health), config.timeout_s)
    return PDSystem(urls, stack)


def server(config: PDSystemConfig, role: str, port: int, backend: str) -> Service:
    """One vLLM server of the pair, its connectors' spans and its own to the backend."""
    cmd = serve_command(config.model, port, config.engine_config(free_port()))
    cmd += traced_serve_args(backend)
    cmd += ["--served-model-name", SERVED_MODEL_NAME]
    cmd += ["--num-gpu-blocks-override", str(config.num_device_blocks)]
    env = engine_env(
        **traced_env(backend, f"vllm-{role}", config.otlp_endpoint),
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_BSP_SCHEDULE_DELAY="200",
        **config.role_env(role),
    )
    if config.default_executor:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    url = f"http://127.0.0.1:{port}"
    return Service(role, cmd, env, url + "/health", config.workdir / f"{role}.log")


def service(
    config: PDSystemConfig, name: str, cmd: list[str], env: Mapping[str, str], health_url: str
) -> Service:
    """A service of the system other than a server: this process's environment and `env`."""
    return Service(name, cmd, {**os.environ, **env}, health_url, config.workdir / f"{name}.log")
