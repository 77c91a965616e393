"""Starts real vLLM engines here: in-process LLM objects and `vllm serve` subprocesses."""

import contextlib
import gc
import json
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENGINE_ENV: dict[str, str] = {
    "VLLM_NO_USAGE_STATS": "1",  # never post usage statistics
    "DO_NOT_TRACK": "1",
    "VLLM_HOST_IP": "127.0.0.1",  # never pick the machine's external interface
    "HF_HUB_OFFLINE": "1",  # never reach a model hub
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on the CPU platform
    "OMP_NUM_THREADS": "1",  # without it generation on 2 cores is ~10x slower
    # vLLM's CPU platform otherwise binds an OpenMP team to every core in each server, and
    # two servers' spinning teams on one machine starve each other (seconds per request).
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_WAIT_POLICY": "PASSIVE",
    # A server runs the model in vLLM's engine-core process, not in a worker process of its
    # own: on the CPU platform that worker busy-waits for 1 s after every step (vLLM's
    # shm_broadcast), and in a P/D pair on two cores the spinning workers stalled requests
    # (TTFT 35 ms with a 0.5 s tail, against 27 ms; start 24 s against 16 s). An LLM object
    # then runs its engine in the caller's process.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "UCX_NET_DEVICES": "lo",
}
"""Environment every kvscope-started engine gets (PLATFORM.md explains each)."""

BLOCK_SIZE = 32
"""KV block size in tokens: the CPU attention backend needs a multiple of 32."""


_handed_out: set[int] = set()
_ports = random.SystemRandom()  # vLLM seeds the global `random`: every process would pick alike


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, never the same twice here.

    Taken below the kernel's ephemeral range: a port from bind(0), once released, can go to
    any other bind(0) or outgoing connection (UCX's listeners, vLLM's own sockets) in the
    seconds before the server told to use it binds it, and a P/D server then failed to start.
    """
    high = _ephemeral_range()[0]
    low = max(1024, high - 12000)
    for _ in range(100 if high - low >= 1000 else 0):
        port = _ports.randrange(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:  # that part of the range is full: let the kernel choose
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives out for bind(0) and outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def engine_env(**extra: str) -> dict[str, str]:
    """This process's environment plus ENGINE_ENV and extra, for a subprocess."""
    return {**os.environ, **ENGINE_ENV, **extra}


def use_in_process_engine() -> None:
    """Sets this process up for in-process engines (fast start, one process)."""
    os.environ.update(ENGINE_ENV)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


def llm_kwargs(
    model: Path, kv_transfer_config: dict[str, Any] | None = None, **overrides: Any
) -> dict[str, Any]:
    """Arguments for vllm.LLM that suit the tiny model on a CPU."""
    kwargs: dict[str, Any] = {
        "model": str(model),
        "block_size": BLOCK_SIZE,
        "max_model_len": 1024,
        "enforce_eager": True,
        "seed": 0,
        "max_num_seqs": 16,
        "disable_log_stats": False,
    }
    if kv_transfer_config is not None:
        kwargs["kv_transfer_config"] = kv_transfer_config
    return kwargs | overrides


@contextlib.contextmanager
def in_process_llm(model: Path, kv_transfer_config: dict | None = None, **overrides) -> Iterator:
    """A vllm.LLM in this process, shut down on exit so the next one starts clean."""
    from vllm import LLM

    llm = LLM(**llm_kwargs(model, kv_transfer_config, **overrides))
    try:
        yield llm
    finally:
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def serve_command(model: Path, port: int, kv_transfer_config: dict | None = None) -> list[str]:
    """The `vllm serve` equivalent (the vllm-cpu distribution has no working `vllm` script)."""
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--block-size",
        str(BLOCK_SIZE),
        "--max-model-len",
        "1024",
        "--enforce-eager",
        "--seed",
        "0",
        "--max-num-seqs",
        "16",
    ]
    if kv_transfer_config is not None:
        cmd += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
    return cmd


class ServerProcess:
    """A vLLM OpenAI-compatible server subprocess on 127.0.0.1 with a start-up timeout."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str], log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"vLLM server exited ({self.process.returncode}); see {self.log_path}"
                )
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/health", timeout=2) as response,
            ):
                if response.status == 200:
                    return
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not ready after {timeout_s:.0f} s; see {self.log_path}")

    def stop(self, timeout_s: float = 20) -> int | None:
        """SIGTERM, then SIGKILL of the whole process group; returns the exit code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, 9)
                self.process.wait(5)
        self._log.close()
        return self.process.returncode
