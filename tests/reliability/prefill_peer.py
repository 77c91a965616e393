"""A prefill engine in a subprocess (in-process vLLM + P2P connector), driven over stdin/stdout."""

# python -m tests.reliability.prefill_peer MODEL KV_TRANSFER_CONFIG_JSON
# Faster to start than `vllm serve` (no HTTP server, no engine-core process). Commands are JSON
# lines; replies are lines starting with REPLY. Between commands it steps its engine while it
# holds blocks for a reader, as a server's engine loop would.

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

READY = "RELIABILITY_PEER_READY"
REPLY = "RELIABILITY_PEER_REPLY"
_IDLE_STEP_S = 0.02


def _prefill(llm: Any, prompts: list[str], tag: str) -> list[dict]:
    """kv_transfer_params per prompt: what a proxy forwards to the decode side."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    remote_decode = {"kv_transfer_params": {"do_remote_decode": True}}
    params = SamplingParams(temperature=0.0, max_tokens=1, extra_args=remote_decode)
    order = [f"{tag}-{i}" for i in range(len(prompts))]
    for req_id, prompt in zip(order, prompts, strict=True):
        engine.add_request(req_id, prompt, params)
    found: dict[str, dict] = {}
    deadline = time.monotonic() + 60
    while len(found) < len(order) and time.monotonic() < deadline:
        for output in engine.step():
            if output.finished:
                found[output.request_id] = output.kv_transfer_params
    return [found.get(req_id) for req_id in order]


def _prefill_leased(llm: Any, command: dict) -> list[dict]:
    """_prefill; the command's lease_s (if any) holds these blocks, not the peer's lease."""
    from dataclasses import replace

    from kvscope.harness.engine_state import scheduler_connector

    p2p = scheduler_connector(llm).scheduler
    saved = p2p.config
    if command.get("lease_s") is not None:
        p2p.config = replace(saved, lease_timeout_s=float(command["lease_s"]))
    try:
        return _prefill(llm, command["prompts"], command["tag"])
    finally:
        p2p.config = saved


def _state(llm: Any) -> dict:
    from kvscope.harness.engine_state import leaked_device_blocks, scheduler_connector

    p2p = scheduler_connector(llm).scheduler
    return {
        "held": sorted(p2p.held_for_readers),
        "leaked_blocks": leaked_device_blocks(llm),
        "stats": p2p.stats.as_dict(),
    }


def _serve(model: Path, config: dict) -> None:
    from kvscope.harness.engine import in_process_llm, use_in_process_engine
    from kvscope.harness.engine_state import engine_scheduler

    use_in_process_engine()
    commands: queue.Queue[dict | None] = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            commands.put(json.loads(line))
        commands.put(None)  # stdin closed: the test is gone

    with in_process_llm(model, config, num_gpu_blocks_override=256) as llm:
        print(READY, flush=True)
        threading.Thread(target=read_stdin, daemon=True).start()
        while True:
            busy = engine_scheduler(llm).has_requests()
            try:
                command = commands.get(timeout=_IDLE_STEP_S if busy else 0.2)
            except queue.Empty:
                if busy:
                    llm.llm_engine.step()  # keeps finished_sending flowing
                continue
            if command is None:
                break
            if command["op"] == "prefill":
                reply = {"params": _prefill_leased(llm, command)}
            else:
                reply = _state(llm)
            print(REPLY, json.dumps(reply), flush=True)


class PrefillPeer:
    """Handle on a running prefill_peer subprocess: commands with timeouts, stop, kill."""

    def __init__(self, model: Path, config: dict, env: dict[str, str], log_path: Path) -> None:
        cmd = [
            sys.executable,
            "-m",
            "tests.reliability.prefill_peer",
            str(model),
            json.dumps(config),
        ]
        self.log_path = log_path
        self.process = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
        self._lines: queue.Queue[str] = queue.Queue()
        self.log_tail: deque[str] = deque(maxlen=60)
        threading.Thread(target=self._drain, daemon=True).start()
        self._ready = False
        self.stash: dict = {}  # whatever a test keeps with this peer (params it prefilled)

    def wait_ready(self, timeout_s: float = 120) -> "PrefillPeer":
        if not self._ready:
            self._next(READY, timeout_s)
            self._ready = True
        return self

    def prefill(
        self, prompts: list[str], tag: str, timeout_s: float = 60, lease_s: float | None = None
    ) -> list[dict]:
        """kv_transfer_params per prompt; lease_s holds these blocks that long (not the peer's)."""
        command = {"op": "prefill", "prompts": prompts, "tag": tag, "lease_s": lease_s}
        params = self._request(command, timeout_s)
        if any(p is None for p in params["params"]):
            raise RuntimeError(f"the prefill peer returned no kv_transfer_params: {params}")
        return params["params"]

    def state(self, timeout_s: float = 20) -> dict:
        return self._request({"op": "state"}, timeout_s)

    def wait_until_nothing_held(self, timeout_s: float) -> dict:
        """The peer's state once it holds no blocks for a reader; AssertionError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.state()
            if not state["held"] and state["leaked_blocks"] == 0:
                return state
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"prefill side still holds blocks after {timeout_s} s: {state}"
                )
            time.sleep(0.2)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(10)

    def stop(self, timeout_s: float = 20) -> None:
        if not self.alive:
            return
        self.resume()
        try:
            self.process.stdin.close()
            self.process.wait(timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            self.kill()

    def _request(self, command: dict, timeout_s: float) -> dict:
        self.wait_ready()
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return json.loads(self._next(REPLY, timeout_s).split(" ", 1)[1])

    def _drain(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.process.stdout:
                if line.startswith((READY, REPLY)):
                    self._lines.put(line.strip())
                else:
                    log.write(line)
                    self.log_tail.append(line.rstrip())

    def _next(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                if not self.alive:
                    break
                continue
            if line.startswith(prefix):
                return line
        tail = "\n".join(list(self.log_tail)[-20:])
        raise TimeoutError(f"prefill peer sent no {prefix} in {timeout_s} s:\n{tail}")


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), json.loads(sys.argv[2]))
