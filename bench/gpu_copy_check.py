"""The offload copy engine on a GPU: byte-exact round trips, no host syncs, no device memory
growth, and loads overlapping a matmul on the compute stream; one JSON file of results.

Needs torch only (no vLLM). `--device cpu` runs the same checks on the CPU engine, where the
sync and memory checks do not apply, so tests can run this module anywhere.
"""

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kvscope.bench.results import record
from kvscope.connector.common.copy_engine import CopyEngine, make_copy_engine
from kvscope.connector.common.host_buffer import BlockLayout, HostBuffer

MIN_OVERLAP = 0.5  # of the shorter of load and matmul, hidden behind the other (CUDA only)


def kv_layers(layout: str, num_blocks: int, device: str, block_mib: float) -> tuple[list, int]:
    """vLLM's flash layout [2, nb, bs, h, d] (block dim 1) or a layer-major [nb, ...] one."""
    heads, head_dim = 8, 128
    block_size = max(1, int(block_mib * 2**20 / (2 * heads * head_dim * 2)))
    generator = torch.Generator().manual_seed(0)
    if layout == "flash":
        shape, block_dim = (2, num_blocks, block_size, heads, head_dim), 1
    else:
        shape, block_dim = (num_blocks, heads, block_size, 2 * head_dim), 0
    layers = [torch.randn(shape, generator=generator).to(device, torch.bfloat16) for _ in range(2)]
    return layers, block_dim


def engine_for(layers: list, block_dim: int, num_host_blocks: int) -> CopyEngine:
    layout = BlockLayout.of(layers, block_dim)
    pinned = layers[0].device.type == "cuda"
    return make_copy_engine(
        layers, HostBuffer(layout, num_host_blocks, pin_memory=pinned), block_dim
    )


def block_bytes(layers: list, block_dim: int, block_id: int) -> torch.Tensor:
    return torch.stack([layer.select(block_dim, block_id).cpu() for layer in layers]).view(
        torch.int16
    )


def check_round_trip(device: str, layout: str, scattered: bool) -> dict:
    """Store blocks, load them into other blocks: equal bytes there, nothing else touched."""
    layers, block_dim = kv_layers(layout, 64, device, block_mib=0.25)
    engine = engine_for(layers, block_dim, num_host_blocks=32)
    sources = [5, 61, 2, 30, 17, 8] if scattered else [10, 11, 12, 13, 14, 15]
    targets = [40, 3, 50, 22, 9, 33] if scattered else [40, 41, 42, 43, 44, 45]
    hosts = [7, 1, 20, 2, 3, 31] if scattered else [0, 1, 2, 3, 4, 5]
    expected = [block_bytes(layers, block_dim, b) for b in sources]
    others = [b for b in range(64) if b not in targets]
    before = {b: block_bytes(layers, block_dim, b) for b in others}
    engine.wait(engine.submit_store(sources, hosts))
    engine.wait(engine.submit_load(targets, hosts))
    results = engine.poll()
    engine.shutdown()
    exact = all(
        torch.equal(block_bytes(layers, block_dim, t), e)
        for t, e in zip(targets, expected, strict=True)
    )
    untouched = all(torch.equal(block_bytes(layers, block_dim, b), before[b]) for b in others)
    errors = [r.error for r in results if not r.ok]
    return {"layout": layout, "scattered": scattered, "ok": exact and untouched and not errors,
            "byte_exact": exact, "others_untouched": untouched, "errors": errors}  # fmt: skip


def check_no_host_sync(device: str) -> dict:
    """Submitting and polling never wait for the GPU: torch raises on any synchronising call."""
    if device != "cuda":
        return {"ok": True, "applies": False}
    layers, block_dim = kv_layers("flash", 64, device, block_mib=0.25)
    engine = engine_for(layers, block_dim, num_host_blocks=32)
    engine.wait(engine.submit_store([1, 9, 4], [0, 1, 2]))  # warm-up: first allocations
    engine.poll()
    error = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in range(10):
            engine.submit_store(
                [step, 20 + step, 40 + step], [3 * step, 3 * step + 1, 3 * step + 2]
            )
            engine.submit_load([50 + step % 10], [step])
            engine.poll()
    except RuntimeError as exc:
        error = str(exc)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    engine.shutdown()
    return {"ok": error is None, "applies": True, "error": error}


def check_no_memory_growth(device: str) -> dict:
    """After the engine is built, its jobs allocate no device memory (staging is reused)."""
    if device != "cuda":
        return {"ok": True, "applies": False}
    layers, block_dim = kv_layers("flash", 256, device, block_mib=0.25)
    engine = engine_for(layers, block_dim, num_host_blocks=128)
    ids = torch.randperm(256, generator=torch.Generator().manual_seed(1))[:96].tolist()
    engine.wait(engine.submit_store(ids, list(range(96))))  # warm-up: both streams, once
    engine.wait(engine.submit_load(ids, list(range(96))))
    engine.poll()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(5):
        engine.submit_store(ids, list(range(96)))
        engine.submit_load(ids[::-1], list(range(96)))
    engine.drain()
    growth = torch.cuda.max_memory_allocated() - baseline
    engine.shutdown()
    return {"ok": growth == 0, "applies": True, "peak_growth_bytes": int(growth)}


def timed(action: Callable[[], None], sync: Callable[[], None]) -> float:
    sync()
    started = time.perf_counter()
    action()
    sync()
    return time.perf_counter() - started


def check_overlap(device: str, load_mib: int) -> dict:
    """A load submitted before a matmul runs beside it: overlap 1 hides the shorter fully."""
    num_blocks = 2 * load_mib
    layers, block_dim = kv_layers("flash", num_blocks, device, block_mib=0.5)  # 2 layers: 1 MiB
    engine = engine_for(layers, block_dim, num_host_blocks=load_mib)
    ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(2))[:load_mib]
    sync = torch.cuda.synchronize if device == "cuda" else lambda: None
    size = 4096 if device == "cuda" else 384
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)

    def load() -> None:
        engine.wait(engine.submit_load(ids.tolist(), list(range(load_mib))))

    def matmuls(count: int) -> Callable[[], None]:
        def compute() -> None:
            for _ in range(count):
                torch.mm(a, a)

        return compute

    load_s = min(timed(load, sync) for _ in range(3))
    one_s = min(timed(matmuls(4), sync) for _ in range(3)) / 4
    count = max(1, round(load_s / one_s))  # a compute phase about as long as the load
    compute_s = min(timed(matmuls(count), sync) for _ in range(3))

    def both() -> None:
        job = engine.submit_load(ids.tolist(), list(range(load_mib)))
        matmuls(count)()
        engine.wait(job)

    both_s = min(timed(both, sync) for _ in range(3))
    engine.poll()
    engine.shutdown()
    overlap = (load_s + compute_s - both_s) / min(load_s, compute_s)
    ok = device != "cuda" or overlap >= MIN_OVERLAP
    return {"ok": ok, "load_s": load_s, "compute_s": compute_s, "both_s": both_s,
            "overlap": overlap, "matmuls": count, "load_mib": load_mib,
            "compute_slowdown": both_s / compute_s}  # fmt: skip


def run(device: str, load_mib: int) -> dict:
    cases = [(layout, scattered) for layout in ("flash", "layer_major") for scattered in (0, 1)]
    round_trips = [check_round_trip(device, layout, bool(scattered)) for layout, scattered in cases]
    checks = {"round_trips": round_trips, "no_host_sync": check_no_host_sync(device),
              "no_memory_growth": check_no_memory_growth(device),
              "overlap": check_overlap(device, load_mib)}  # fmt: skip
    ok = all(r["ok"] for r in round_trips) and all(
        checks[name]["ok"] for name in ("no_host_sync", "no_memory_growth", "overlap")
    )
    return {"device": device, "torch": torch.__version__, "ok": ok, **checks}


def print_summary(report: dict) -> None:
    for trip in report["round_trips"]:
        kind = "scattered" if trip["scattered"] else "contiguous"
        print(f"round trip {trip['layout']:<12} {kind:<10} {'ok' if trip['ok'] else 'FAIL'}")
    for name in ("no_host_sync", "no_memory_growth"):
        check = report[name]
        state = ("ok" if check["ok"] else "FAIL") if check["applies"] else "n/a on the CPU"
        print(f"{name:<34} {state} {check.get('error') or check.get('peak_growth_bytes', '')}")
    o = report["overlap"]
    print(f"load {o['load_s'] * 1e3:.1f} ms, {o['matmuls']} matmuls "
          f"{o['compute_s'] * 1e3:.1f} ms, both {o['both_s'] * 1e3:.1f} ms: overlap "
          f"{o['overlap']:.2f} (>= {MIN_OVERLAP} on CUDA), compute slowed "
          f"{o['compute_slowdown']:.2f}x")  # fmt: skip
    note = f"{o['load_mib']} MiB load beside {o['matmuls']} matmuls"
    record("gpu_copy_check", f"load_matmul_overlap_{report['device']}", o["overlap"], "ratio",
           f">= {MIN_OVERLAP}", note)  # fmt: skip
    print(f"verdict {'PASS' if report['ok'] else 'FAIL'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--load-mib", type=int, default=256, help="the overlap check's load")
    parser.add_argument("--out", type=Path, help="JSON file for the results")
    args = parser.parse_args(argv)
    report = run(args.device, args.load_mib)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
    print_summary(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
