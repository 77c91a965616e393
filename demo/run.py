"""`kvscope demo`: backend, dashboard, a prefill and a decode vLLM server, the P/D proxy and a
workload with scheduled faults, on this machine; Ctrl-C stops everything."""

import asyncio
import json
import signal
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kvscope.demo.fault_schedule import FaultSchedule
from kvscope.demo.stack import Stack
from kvscope.demo.workload import WorkloadStats, run_workload
from kvscope.harness.configs import demo_config
from kvscope.harness.pd_system import PDSystemConfig, start_pd_system


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


def start_stack(options: DemoOptions, workdir: Path, stack: Stack) -> dict[str, str]:
    """Starts every service; returns their URLs."""
    config = PDSystemConfig(
        model=options.model,
        workdir=workdir,
        engine_config=lambda side_channel_port: demo_config(
            side_channel_port, workdir / "faults.json"
        ),
        backend_port=options.backend_port,
        proxy_port=options.proxy_port,
        dashboard_port=options.dashboard_port if options.dashboard else None,
        otlp_endpoint=options.otlp_endpoint,
    )
    return start_pd_system(config, stack).urls


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
