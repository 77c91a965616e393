"""Loads beside compute as vLLM orders them: overlap with the next step, decode kernel speed."""

import statistics
import time
from collections.abc import Callable
from typing import Final

import torch

from kvscope.bench.common.results import record
from kvscope.bench.transfer.kv_views import KVShape, vllm_kv_layers
from kvscope.connector.cpu_offload.copy.engine import CopyEngine
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer

MIN_OVERLAP: Final = 0.5
"""Of the shorter of the load and the next step, hidden behind the other (CUDA only)."""
MAX_DECODE_SLOWDOWN: Final = 1.05
"""Time per decode-like kernel while loads run over the same kernel alone (CUDA only)."""
RUN_BLOCKS: Final = 16
"""Device blocks per consecutive run of a load: a request's blocks come in such runs."""


def load_engine(device: str, load_mib: int, layout: str) -> tuple[CopyEngine, int]:
    """An engine over twice load_mib of KV (two layers, 256 KiB a block) and its host pool."""
    num_blocks = max(2 * RUN_BLOCKS, 4 * load_mib)  # 0.25 MiB a block across both layers
    kv = KVShape(
        num_layers=2, num_blocks=2 * num_blocks, num_kv_heads=8, block_size=32, head_size=128
    )
    layers = vllm_kv_layers(layout, kv, device, seed=3)
    host_buffer = HostBuffer(BlockLayout.of(layers, 0), num_blocks, device == "cuda")
    return make_copy_engine(layers, host_buffer, 0), num_blocks


def load_ids(num_blocks: int, scattered: bool) -> list[int]:
    """Device ids of a load of num_blocks: runs of RUN_BLOCKS in shuffled order, or all shuffled."""
    generator = torch.Generator().manual_seed(4)
    if scattered:
        return torch.randperm(2 * num_blocks, generator=generator)[:num_blocks].tolist()
    runs = torch.randperm(2 * num_blocks // RUN_BLOCKS, generator=generator)
    starts = runs[: num_blocks // RUN_BLOCKS].tolist()
    return [start * RUN_BLOCKS + n for start in starts for n in range(RUN_BLOCKS)]


def synchronizer(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else lambda: None


def timed(action: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    started = time.perf_counter()
    action()
    sync()
    return time.perf_counter() - started


def check_overlap(device: str, load_mib: int) -> dict:
    """Step A queued, then the load (it waits for A on its stream), then step B: the load
    should hide behind B. overlap 1: the shorter of load and B is hidden fully."""
    engine, num_blocks = load_engine(device, load_mib, "LBHNC")
    ids, hosts = load_ids(num_blocks, scattered=False), list(range(num_blocks))
    sync = synchronizer(device)
    size = 4096 if device == "cuda" else 384
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)

    def load() -> None:
        engine.wait(engine.submit_load(ids, hosts))

    def matmuls(count: int) -> None:
        for _ in range(count):
            torch.mm(a, a)

    load()  # warm-up
    load_s = min(timed(load, sync) for _ in range(3))
    one_s = min(timed(lambda: matmuls(4), sync) for _ in range(3)) / 4
    count = max(1, round(load_s / one_s))  # a step about as long as the load
    step_s = min(timed(lambda: matmuls(count), sync) for _ in range(3))

    def two_steps_with_a_load_between() -> None:
        matmuls(count)  # step A's forward, queued
        job = engine.submit_load(ids, hosts)  # vLLM: async loads after the forward is queued
        matmuls(count)  # step B
        engine.wait(job)

    both_s = min(timed(two_steps_with_a_load_between, sync) for _ in range(3))
    engine.poll()
    engine.shutdown()
    engine.host_buffer.close()
    overlap = (2 * step_s + load_s - both_s) / min(load_s, step_s)
    ok = device != "cuda" or overlap >= MIN_OVERLAP
    note = f"{load_mib} MiB load between two steps of {count} matmuls ({device})"
    record(
        "gpu_copy_check",
        f"load_after_compute_overlap_{device}",
        overlap,
        "ratio",
        f">= {MIN_OVERLAP}",
        note,
    )
    return {
        "ok": ok,
        "applies": device == "cuda",
        "load_s": load_s,
        "step_s": step_s,
        "both_s": both_s,
        "overlap": overlap,
        "matmuls": count,
        "load_mib": load_mib,
    }


def decode_rounds(device: str, engine: CopyEngine, ids: list[int], kernels: int) -> list[float]:
    """Seconds per decode-like kernel, alternately without and with a load running."""
    sync = synchronizer(device)
    hidden = 8192 if device == "cuda" else 256  # 128 MiB of weights: past L2, read each time
    batch = 64 if device == "cuda" else 8
    x = torch.randn(batch, hidden, device=device, dtype=torch.bfloat16)
    weight = torch.randn(hidden, hidden, device=device, dtype=torch.bfloat16)
    hosts = list(range(len(ids)))
    quiet, loaded = [], []
    for round_index in range(12):
        with_load = round_index % 2 == 1
        sync()
        job = engine.submit_load(ids, hosts) if with_load else None
        started = time.perf_counter()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        for _ in range(kernels):
            torch.mm(x, weight)
        if device == "cuda":
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1000
        else:
            seconds = time.perf_counter() - started
        if job is not None:
            engine.wait(job)
        if round_index >= 2:  # the first pair warms up
            (loaded if with_load else quiet).append(seconds / kernels)
    engine.poll()
    return [statistics.median(quiet), statistics.median(loaded)]


def decode_slowdown(device: str, layout: str, scattered: bool, load_mib: int) -> dict:
    """Per-kernel time beside one kind of load, over no load, with rounds as long as a load."""
    engine, num_blocks = load_engine(device, load_mib, layout)
    ids, hosts = load_ids(num_blocks, scattered), list(range(num_blocks))

    def load() -> None:
        engine.wait(engine.submit_load(ids, hosts))

    load_s = min(timed(load, synchronizer(device)) for _ in range(2))
    engine.poll()
    kernels = 50 if device == "cuda" else 20
    quiet_s, loaded_s = decode_rounds(device, engine, ids, kernels)
    if device == "cuda":  # a round as long as most of a load, so every kernel runs beside it
        kernels = max(kernels, int(0.8 * load_s / quiet_s))
        quiet_s, loaded_s = decode_rounds(device, engine, ids, kernels)
    engine.shutdown()
    engine.host_buffer.close()
    return {
        "kernel_us": quiet_s * 1e6,
        "kernel_with_load_us": loaded_s * 1e6,
        "slowdown": loaded_s / quiet_s,
        "kernels_per_round": kernels,
        "load_ms": load_s * 1e3,
        "load_mib": load_mib,
    }


def check_decode_slowdown(device: str) -> dict:
    """Per-kernel time of small matmuls (decode-like: weight-bound) beside loads of runs of
    blocks (memcpys only), and beside scattered loads (gather kernels), over no load."""
    load_mib = 256 if device == "cuda" else 8
    report: dict = {
        "applies": device == "cuda",
        "direct": decode_slowdown(device, "LBHNC", False, load_mib),
        "gathered": decode_slowdown(device, "LBNHC", True, load_mib),
    }
    slowdown = report["direct"]["slowdown"]
    report["ok"] = device != "cuda" or slowdown <= MAX_DECODE_SLOWDOWN
    note = (
        f"{load_mib} MiB loads of {RUN_BLOCKS}-block runs ({device}); scattered loads "
        f"(gathers): {report['gathered']['slowdown']:.3f}x"
    )
    record(
        "gpu_copy_check",
        f"decode_kernel_slowdown_{device}",
        slowdown,
        "ratio",
        f"<= {MAX_DECODE_SLOWDOWN}",
        note,
    )
    return report
