"""A test double for P2P: a stand-in KV owner process serving a fake KV cache, and its handle."""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Final

import torch

READY: Final = "KVSCOPE_PEER_READY"
"""Prefix of the line the child prints once it serves; stdout also carries NIXL's own logs."""
REPLY: Final = "KVSCOPE_PEER_REPLY"
"""Prefix of the child's answers to commands."""
RAW_PROGRESS_THREAD: Final = "progress-thread"
"""Raw NIXL owner as shipped: NIXL's progress thread progresses it (and spins a core)."""
RAW_POLL_1MS: Final = "poll-1ms"
"""Raw NIXL owner without the progress thread, its agent polled by hand every millisecond."""


@dataclass(frozen=True)
class FakeKVShape:
    """A small model's KV cache in one of vLLM's layouts (kept in DRAM)."""

    num_layers: int = 4
    num_blocks: int = 64
    num_kv_heads: int = 2
    block_size: int = 32
    head_dim: int = 32
    kv_layout: str = "LBHNC"  # vLLM's KVCacheLayout name; the CPU attention backend's only one

    def to_args(self) -> list[str]:
        return [f"--{k.replace('_', '-')}={v}" for k, v in self.__dict__.items()]


def make_fake_kv_caches(
    shape: FakeKVShape, seed: int | None, device: str = "cpu"
) -> dict[str, torch.Tensor]:
    """vLLM's own per-layer bf16 views [B, H, N, C] of one buffer, in `shape.kv_layout`
    (built by vLLM's compute_layout_strides and create_kv_cache_views); random bits if seeded.
    The buffer's bytes depend only on the seed, so views of two layouts hold different KV."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )
    from vllm.v1.kv_cache_layout import KVCacheLayout

    spec = FullAttentionSpec(
        block_size=shape.block_size,
        num_kv_heads=shape.num_kv_heads,
        head_size=shape.head_dim,
        dtype=torch.bfloat16,
    )
    layout = KVCacheLayout[shape.kv_layout]
    layer_stride, block_stride, *_ = compute_layout_strides(
        spec, shape.num_blocks, shape.num_layers, layout
    )
    size = shape.num_layers * shape.num_blocks * spec.page_size_bytes
    if seed is None:
        raw = torch.zeros(size, dtype=torch.int8)
    else:
        generator = torch.Generator().manual_seed(seed)
        bits = torch.randint(-(2**15), 2**15, (size // 2,), dtype=torch.int16, generator=generator)
        raw = bits.view(torch.int8)
    raw = raw.to(device)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(shape.num_layers)]
    tensor = KVCacheTensor(
        size=size, layers=names, layer_stride=layer_stride, block_stride=block_stride
    )
    views = create_kv_cache_views(raw, spec, shape.num_blocks, layout, tensor)
    return dict(zip(names, views, strict=True))


def _serve(args: argparse.Namespace) -> None:
    """Child main: serve the fake KV cache until stdin closes, answering commands on stdin."""
    from kvscope.connector.p2p.transport.nixl_transport import NixlTransport
    from kvscope.connector.p2p.transport.side_channel import SideChannelServer

    shape = FakeKVShape(**{name: getattr(args, name) for name in FakeKVShape().__dict__})
    kv_caches = make_fake_kv_caches(shape, args.seed)
    if args.raw:
        # raw_agent is unused but referenced: the agent must live while we serve.
        raw_agent, agent_name, server = _serve_raw(args, kv_caches, shape)
    else:
        transport = NixlTransport(args.engine_id, kv_caches, kv_layout=shape.kv_layout)
        server = SideChannelServer(
            port=args.port, on_request=lambda: transport.expect_activity(1.0)
        )
        server.publish(transport.peer_info())
        agent_name = transport.agent_name
    print(f"{READY} {server.port} {agent_name}", flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        reply = {} if args.raw else _run_command(transport, command)
        print(f"{REPLY} {json.dumps(reply)}", flush=True)
    server.close()
    if not args.raw:
        transport.close()


def _run_command(transport: Any, command: dict[str, Any]) -> dict[str, Any]:
    if command["cmd"] == "expect":
        transport.expect_remote_read(command["msg"].encode(), command["timeout_s"])
    if command["cmd"] == "notifs":
        notifs = [[n.peer, n.message.decode()] for n in transport.get_notifs()]
        expired = [m.decode() for m in transport.expired_remote_reads()]
        return {"notifs": notifs, "expired": expired}
    return {}


def _serve_raw(
    args: argparse.Namespace, kv_caches: dict[str, torch.Tensor], shape: FakeKVShape
) -> tuple[Any, str, Any]:
    """Plain nixl_agent calls, no kvscope transport: the baselines of bench/nixl_bandwidth."""
    from kvscope.connector.p2p.transport.layout import KVLayout
    from kvscope.connector.p2p.transport.nixl_agent import load_nixl_api
    from kvscope.connector.p2p.transport.side_channel import PeerInfo, SideChannelServer

    layout = KVLayout.from_layer_tensors(args.engine_id, kv_caches, kv_layout=shape.kv_layout)
    agent_name = f"raw-{args.engine_id}-{os.getpid()}"
    progress_thread = args.raw == RAW_PROGRESS_THREAD
    api = load_nixl_api()
    agent = api.nixl_agent(agent_name, api.nixl_agent_config(enable_prog_thread=progress_thread))
    regions = [(a, n, 0, "") for a, n in layout.registration_regions()]
    agent.register_memory(regions, "DRAM")
    server = SideChannelServer(port=args.port)
    server.publish(PeerInfo(agent_name, agent.get_agent_metadata(), layout))
    if not progress_thread:  # started last: from here on only this thread calls the agent
        threading.Thread(target=_poll_every_ms, args=(agent,), daemon=True).start()
    return agent, agent_name, server


def _poll_every_ms(agent: Any) -> None:
    while True:
        agent.get_new_notifs()
        time.sleep(0.001)


class PeerProcess:
    """A running stand-in owner: its side-channel port, agent name, and commands with timeouts."""

    def __init__(
        self,
        engine_id: str = "prefill",
        shape: FakeKVShape | None = None,
        seed: int | None = 1,
        raw: str | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.shape = shape or FakeKVShape()
        argv = [sys.executable, "-m", __name__, f"--engine-id={engine_id}", *self.shape.to_args()]
        argv += [f"--seed={seed}"] if seed is not None else []
        argv += [f"--raw={raw}"] if raw else []
        env = {**os.environ, "UCX_NET_DEVICES": os.environ.get("UCX_NET_DEVICES", "lo")}
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self.pid = self._proc.pid
        self._lines: queue.Queue[str] = queue.Queue()
        self.log_tail: deque[str] = deque(maxlen=40)  # the child's own output, for error messages
        threading.Thread(target=self._drain_stdout, daemon=True).start()
        try:
            _, port, self.agent_name = self._next(READY, start_timeout_s).split()
        except BaseException:
            self.stop()
            raise
        self.port = int(port)

    def request(self, command: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any]:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(command) + "\n")
        self._proc.stdin.flush()
        return json.loads(self._next(REPLY, timeout_s).split(" ", 1)[1])

    def cpu_seconds(self) -> float:
        """User + system CPU time the child has used so far."""
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def pause(self, timeout_s: float = 5.0) -> None:
        """SIGSTOP the child (alive, sockets open, silent) and wait until it is really stopped."""
        os.kill(self.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout_s
        while self._state() not in ("T", "t"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"peer process {self.pid} did not stop")
            time.sleep(0.005)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def _state(self) -> str:
        with open(f"/proc/{self.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close stdin (the child exits cleanly), then kill it if it does not."""
        try:
            if self._proc.stdin:
                self._proc.stdin.close()
            self._proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, OSError):
            self._proc.kill()
            self._proc.wait(timeout=timeout_s)

    def kill(self) -> None:
        self._proc.kill()
        self._proc.wait(timeout=5.0)

    def _drain_stdout(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith((READY, REPLY)):
                self._lines.put(line.strip())
            else:
                self.log_tail.append(line.rstrip())

    def _next(self, prefix: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self._proc.poll() is not None:
                    break
                continue
            if line.startswith(prefix):
                return line
        tail = "\n".join(self.log_tail)
        raise TimeoutError(f"peer process {self.pid} sent no {prefix} in {timeout_s} s:\n{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine-id", default="prefill")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--raw", choices=(RAW_PROGRESS_THREAD, RAW_POLL_1MS), help="plain NIXL, no kvscope"
    )
    for name, default in FakeKVShape().__dict__.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    _serve(parser.parse_args())


if __name__ == "__main__":
    main()
