"""Starts the demo's P/D system for the soak (no dashboard) and reads each server's state."""

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvscope.bench.soak.probe import STATE_FILE_ENV
from kvscope.demo.stack import Service, Stack
from kvscope.harness.configs import child, demo_children, engine_config
from kvscope.harness.engine import engine_env, free_port, serve_command

SERVERS = ("prefill", "decode")
PROBE_MODULE = "kvscope.bench.soak.probe"
NUM_DEVICE_BLOCKS = 64
"""The demo's small KV cache: vLLM's prefix cache evicts and the offload pool gets hits."""


@dataclass
class System:
    """The running services' URLs and where each server's probe writes its state."""

    urls: dict[str, str]
    state_files: dict[str, Path]
    stack: Stack

    def connector_state(self, role: str, max_age_s: float = 5.0) -> dict | None:
        """The server's own connector state, written by the probe at most max_age_s ago."""
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.state_files[role].read_text())
            if time.time() - state["time"] <= max_age_s:
                return state
        return None


def probe_config(
    side_channel_port: int, faults_path: Path, policy: str, tier_health: dict | None = None
) -> dict:
    """The demo's engine config, loaded through the soak's probe subclass; tier_health, when
    given, replaces the offload pool's breaker settings (connector/common/tier_health.py)."""
    offload_extra = {} if tier_health is None else {"tier_health": tier_health}
    children = demo_children(side_channel_port, faults_path, **offload_extra)
    probe = child("multi", "SoakProbeConnector", PROBE_MODULE, connectors=children)
    return engine_config(probe, policy)


def start_system(
    model: Path,
    workdir: Path,
    stack: Stack,
    policy: str,
    timeout_s: float,
    default_executor: bool = False,
    tier_health: dict | None = None,
) -> System:
    """Backend (SQLite), prefill and decode servers (started together), then the proxy.

    default_executor: the servers run as vLLM does by default (engine core and model worker in
    processes of their own) instead of with kvscope's VLLM_ENABLE_V1_MULTIPROCESSING=0."""
    executor = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"} if default_executor else {}
    python = [sys.executable, "-m"]
    backend_port, proxy_port = free_port(), free_port()
    backend = f"http://127.0.0.1:{backend_port}"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{workdir / 'kvscope.db'}"}
    stack.start(
        Service(
            "backend",
            [*python, "kvscope.cli.main", "backend", "--port", str(backend_port)],
            env,
            backend + "/health",
            workdir / "backend.log",
        ),
        timeout_s,
    )
    urls, state_files, servers = {"backend": backend}, {}, []
    for role in SERVERS:
        port = free_port()
        cmd = serve_command(
            model, port, probe_config(free_port(), workdir / "faults.json", policy, tier_health)
        )
        cmd += [
            "--otlp-traces-endpoint",
            backend + "/v1/traces",
            "--served-model-name",
            "kvscope-tiny",
            "--num-gpu-blocks-override",
            str(NUM_DEVICE_BLOCKS),
        ]
        state_files[role] = workdir / f"{role}.state.json"
        server_env = engine_env(
            KVSCOPE_OTLP_ENDPOINTS=backend + "/v1/traces",
            OTEL_SERVICE_NAME=f"vllm-{role}",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
            OTEL_BSP_SCHEDULE_DELAY="200",
            **{STATE_FILE_ENV: str(state_files[role])},
            **executor,
        )
        urls[role] = f"http://127.0.0.1:{port}"
        servers.append(
            Service(role, cmd, server_env, urls[role] + "/health", workdir / f"{role}.log")
        )
    start_together(stack, servers, timeout_s)
    proxy = f"http://127.0.0.1:{proxy_port}"
    cmd = [
        *python,
        "kvscope.harness.proxy",
        "--port",
        str(proxy_port),
        "--prefill-url",
        urls["prefill"],
        "--decode-url",
        urls["decode"],
    ]
    proxy_env = {
        **os.environ,
        "KVSCOPE_OTLP_ENDPOINTS": backend + "/v1/traces",
        "OTEL_SERVICE_NAME": "kvscope-proxy",
    }
    stack.start(
        Service("proxy", cmd, proxy_env, proxy + "/health", workdir / "proxy.log"), timeout_s
    )
    urls["proxy"] = proxy
    return System(urls, state_files, stack)


def start_together(stack: Stack, services: list[Service], timeout_s: float) -> None:
    """Starts the services at once (two vLLM servers start in half the time), waits for all."""
    print(f"  starting {', '.join(s.name for s in services)} ... ", end="", flush=True)
    started = time.monotonic()
    for service in services:
        stack.services.append(service)
        service.start()
    waiting = list(services)
    while waiting:
        stack.check_alive()
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(
                f"{waiting[0].name} not healthy in {timeout_s:.0f} s; see {waiting[0].log_path}"
            )
        waiting = [s for s in waiting if not s.healthy()]
        time.sleep(0.5)
    print(f"ready in {time.monotonic() - started:.0f} s", flush=True)


def stop_all(stack: Stack) -> None:
    """SIGTERM to every service at once (vLLM servers take seconds each to exit), then waits
    for each and SIGKILLs what is left."""
    for service in stack.services:
        if service.process is not None and service.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(service.process.pid, signal.SIGTERM)
    stack.stop()
