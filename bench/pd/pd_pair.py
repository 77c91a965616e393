"""A prefill/decode pair of `vllm serve` processes and the P/D proxy, for tests and benchmarks."""

import contextlib
import os
import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.harness.configs import child, engine_config, p2p_config
from kvscope.harness.engine import ServerProcess, engine_env, free_port, serve_command


def p2p_transfer_config(side_channel_port: int, policy: str = "recompute", **extra: Any) -> dict:
    """kvscope's P2P connector on one engine of the pair."""
    return p2p_config(policy, side_channel_port=side_channel_port, **extra)


def stock_transfer_config() -> dict:
    """vLLM's own NixlConnector with its KV in CPU memory (PLATFORM.md)."""
    nixl = child("nixl", "NixlConnector", None)
    return engine_config(nixl, policy="fail", kv_buffer_device="cpu")  # vLLM's default policy


@dataclass
class PDPair:
    """Two servers; `stock` uses vLLM's NixlConnector, `plain` no connector at all (the idle
    floor of vLLM itself), `cores` pins each server to one core."""

    model: Path
    workdir: Path
    stock: bool = False
    plain: bool = False
    cores: tuple[int, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # our connector's extra config
    env: dict[str, str] = field(default_factory=dict)
    spans_to_files: bool = False  # each server writes its spans to <workdir>/<role>_spans.jsonl
    # The stock pair runs as vLLM does by default, the model in a worker process of its own;
    # True gives it the setting kvscope's servers use (harness/engine.py ENGINE_ENV).
    stock_uniproc: bool = False
    max_model_len: int | None = None  # over serve_command's 1024 (long prompts, mid model)
    serve_args: list[str] = field(default_factory=list)  # more `vllm serve` flags for both
    servers: list[ServerProcess] = field(default_factory=list)

    def start(self, timeout_s: float = 300) -> "PDPair":
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            for role in ("prefill", "decode"):
                self.servers.append(self._launch(role))
            for server in self.servers:
                server.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, role: str) -> ServerProcess:
        port, side_port = free_port(), free_port()
        env = engine_env(**self.env)
        if self.plain:
            config = None
        elif self.stock:
            config = stock_transfer_config()
            if not self.stock_uniproc:
                env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
            env.update(
                VLLM_NIXL_SIDE_CHANNEL_PORT=str(side_port), VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1"
            )
        else:
            config = p2p_transfer_config(side_port, **self.extra)
            if self.spans_to_files:
                env["KVSCOPE_TRACES_FILE"] = str(self.spans_file(role))
        cmd = serve_command(self.model, port, config)
        if self.max_model_len is not None:  # the last one given wins
            cmd += ["--max-model-len", str(self.max_model_len)]
        cmd += self.serve_args
        if self.cores is not None:
            cmd = ["taskset", "-c", str(self.cores[len(self.servers)]), *cmd]
        return ServerProcess(cmd, port, env, self.workdir / f"{role}.log")

    @property
    def prefill(self) -> ServerProcess:
        return self.servers[0]

    @property
    def decode(self) -> ServerProcess:
        return self.servers[1]

    def spans_file(self, role: str) -> Path:
        return self.workdir / f"{role}_spans.jsonl"

    def stop(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.stop()


class ProxyThread:
    """The P/D proxy served by uvicorn in a daemon thread of this process."""

    def __init__(self, prefill_url: str, decode_url: str) -> None:
        import uvicorn

        from kvscope.harness.proxy import create_app

        self.port = free_port()
        config = uvicorn.Config(
            create_app(prefill_url, decode_url),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the P/D proxy did not start within 20 s")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def metric(url: str, name: str, labels: str = "") -> float:
    """Sum of a Prometheus metric's samples on a vLLM server whose labels contain `labels`."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        text = response.read().decode()
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? ([0-9.e+-]+)$", re.M)
    return sum(float(m.group(2)) for m in pattern.finditer(text) if labels in (m.group(1) or ""))


def pid_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children, from /proc."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for proc_pid in [pid, *_descendants(pid)]:
        with contextlib.suppress(OSError), open(f"/proc/{proc_pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _descendants(pid: int) -> list[int]:
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                for child in map(int, handle.read().split()):
                    children += [child, *_descendants(child)]
    return children
