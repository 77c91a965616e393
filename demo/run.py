"""`kvscope demo`: backend, dashboard, a prefill and a decode vLLM server, the P/D proxy and a
workload with scheduled faults, on this machine; Ctrl-C stops everything."""

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvscope.demo.fault_schedule import FaultSchedule
from kvscope.demo.stack import Service, Stack
from kvscope.demo.workload import WorkloadStats, run_workload
from kvscope.harness.configs import demo_config
from kvscope.harness.engine import engine_env, free_port, serve_command


@dataclass
class DemoOptions:
    model: Path
    duration_s: float = 0.0  # 0: until Ctrl-C
    rate_per_s: float = 2.0
    concurrency: int = 4
    faults: bool = True
    dashboard: bool = True
    otlp_endpoint: str | None = None  # an extra destination, e.g. Jaeger: grpc://host:4317
    workdir: Path | None = None
    backend_port: int = 4318
    dashboard_port: int = 8501
    proxy_port: int = 8000


def python(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


def start_stack(options: DemoOptions, workdir: Path, stack: Stack) -> dict[str, str]:
    """Starts every service; returns their URLs."""
    backend = f"http://127.0.0.1:{options.backend_port}"
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{workdir / 'kvscope.db'}"}
    stack.start(
        Service(
            "backend",
            python("kvscope.cli.main", "backend", "--port", str(options.backend_port)),
            env,
            backend + "/health",
            workdir / "backend.log",
        )
    )
    urls = {"backend": backend}
    if options.dashboard:
        dashboard = f"http://127.0.0.1:{options.dashboard_port}"
        cmd = python(
            "kvscope.dashboard", "--port", str(options.dashboard_port), "--backend-url", backend
        )
        stack.start(
            Service(
                "dashboard",
                cmd,
                dict(os.environ),
                dashboard + "/_stcore/health",
                workdir / "dashboard.log",
            )
        )
        urls["dashboard"] = dashboard
    endpoints = ",".join(filter(None, [backend + "/v1/traces", options.otlp_endpoint]))
    for role in ("prefill", "decode"):
        port = free_port()
        config = demo_config(free_port(), workdir / "faults.json")
        cmd = serve_command(options.model, port, config)
        # A small KV cache, so vLLM's own prefix cache evicts and the offload pool gets hits.
        cmd += [
            "--otlp-traces-endpoint",
            backend + "/v1/traces",
            "--served-model-name",
            "kvscope-tiny",
            "--num-gpu-blocks-override",
            "64",
        ]
        server_env = engine_env(
            KVSCOPE_OTLP_ENDPOINTS=endpoints,
            KVSCOPE_BACKEND_URL=backend,
            OTEL_SERVICE_NAME=f"vllm-{role}",
            OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
            OTEL_BSP_SCHEDULE_DELAY="200",
        )
        url = f"http://127.0.0.1:{port}"
        stack.start(Service(role, cmd, server_env, url + "/health", workdir / f"{role}.log"))
        urls[role] = url
    proxy = f"http://127.0.0.1:{options.proxy_port}"
    cmd = python(
        "kvscope.harness.proxy",
        "--port",
        str(options.proxy_port),
        "--prefill-url",
        urls["prefill"],
        "--decode-url",
        urls["decode"],
    )
    proxy_env = {
        **os.environ,
        "KVSCOPE_OTLP_ENDPOINTS": endpoints,
        "KVSCOPE_BACKEND_URL": backend,
        "OTEL_SERVICE_NAME": "kvscope-proxy",
    }
    stack.start(Service("proxy", cmd, proxy_env, proxy + "/health", workdir / "proxy.log"))
    urls["proxy"] = proxy
    return urls


def summary_line(backend: str) -> str:
    """The backend's view of the last minute, in one line."""
    try:
        with urllib.request.urlopen(backend + "/api/v1/stats/summary?window_s=60", timeout=3) as r:
            summary = json.loads(r.read())
    except OSError:
        return "backend unreachable"
    moved = {
        path: f"{t.get('bytes', 0) / 2**20:.1f} MiB" for path, t in summary["transfers"].items()
    }
    failures = ", ".join(f"{c} {n}" for c, n in summary["failures"].items()) or "none"
    return (
        f"last 60 s: {sum(summary['requests'].values())} requests, "
        f"{summary['external_hit_tokens']} external hit tokens, moved {moved or 'nothing'}, "
        f"{summary['leases_active']} leases held, failures: {failures}"
    )


def run_demo(options: DemoOptions) -> int:
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="kvscope-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "faults.json").write_text("{}")
    stack = Stack()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    print(f"kvscope demo: logs and database in {workdir}", flush=True)
    try:
        urls = start_stack(options, workdir, stack)
        print("\n".join(f"  {name:9s} {url}" for name, url in urls.items()))
        print(f"  API docs  {urls['backend']}/docs", flush=True)
        stats = drive(options, urls, workdir, stack)
        print(f"\nworkload done: {stats.line()}\n{summary_line(urls['backend'])}")
        return 0 if stats.ok > 0 else 1
    except KeyboardInterrupt:
        print("\nstopping ...", flush=True)
        return 130
    finally:
        stack.stop()
        print("every demo process has exited", flush=True)


def drive(options: DemoOptions, urls: dict[str, str], workdir: Path, stack: Stack):
    """Runs the workload in slices, printing progress and moving the fault schedule along."""
    stats = WorkloadStats()
    faults = FaultSchedule(workdir / "faults.json", enabled=options.faults)
    # Most requests go through the proxy (P/D); some straight to decode, where the offload
    # pool serves prefixes the decode side has seen.
    targets = [urls["proxy"], urls["proxy"], urls["decode"]]
    started = time.monotonic()
    slice_s = 5.0
    while options.duration_s == 0 or time.monotonic() - started < options.duration_s:
        elapsed = time.monotonic() - started
        fraction = elapsed / options.duration_s if options.duration_s else (elapsed % 120) / 120
        if name := faults.update(fraction):
            print(f"[{elapsed:5.0f} s] faults: {name}", flush=True)
        remaining = options.duration_s - elapsed if options.duration_s else slice_s
        asyncio.run(
            run_workload(
                targets,
                min(slice_s, remaining),
                options.rate_per_s,
                options.concurrency,
                stats,
                seed=stats.sent,
            )
        )
        stack.check_alive()
        print(
            f"[{time.monotonic() - started:5.0f} s] {stats.line()} | "
            f"{summary_line(urls['backend'])}",
            flush=True,
        )
    return stats
