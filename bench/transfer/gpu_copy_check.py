"""The offload copy engine on a GPU over vLLM 0.32's views: pinned pool, round trips, syncs."""

# Needs torch only (no vLLM); one JSON file of results. `--device cpu` runs the same checks on
# the CPU engine, where the pinning, sync and memory checks do not apply, so tests can run it.

import argparse
import json
import sys
from pathlib import Path
from typing import Final

import torch

from kvscope.bench.transfer.gpu_overlap import check_decode_slowdown, check_overlap
from kvscope.bench.transfer.kv_views import KVShape, vllm_kv_layers
from kvscope.connector.cpu_offload.copy.engine import CopyEngine
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer

ROUND_TRIP_LAYOUTS: Final = ("LBNHC", "LBHNC", "BLNHC", "LBHNC/k16", "LBNHC/k16")
"""What vLLM 0.32 hands over on CUDA: its default (LBNHC), what the offload connector asks
for (LBHNC), what NIXL asks for under a Multi (BLNHC), and FlashInfer-style kernel blocks."""


def kv_shape(device: str) -> KVShape:
    if device == "cuda":  # 128 KiB pages, 512 KiB a block across layers
        return KVShape(num_layers=4, num_blocks=64, num_kv_heads=8, block_size=32, head_size=128)
    return KVShape(num_layers=3, num_blocks=64, num_kv_heads=2, block_size=32, head_size=16)


def kv_cache(name: str, device: str, seed: int) -> list[torch.Tensor]:
    """vLLM's views of a layout by name ("LBHNC/k16": 16-token kernel blocks, twice the rows)."""
    layout, _, kernel = name.partition("/k")
    return vllm_kv_layers(layout, kv_shape(device), device, seed, int(kernel) if kernel else None)


def odd_pool_blocks(layout: BlockLayout, device: str) -> int:
    """Host blocks for 1.5 GiB and one block on CUDA (not a power of two), 2 MiB and one here."""
    pool_bytes = int(1.5 * 2**30) if device == "cuda" else 2 * 2**20
    return pool_bytes // layout.bytes_per_block + 1


def block_bits(layers: list[torch.Tensor], block_id: int) -> torch.Tensor:
    return torch.stack([layer[block_id].cpu() for layer in layers]).view(torch.int16)


def check_pinned_pool(device: str) -> tuple[dict, HostBuffer]:
    """The host pool the round trips use: exactly its bytes registered, page-locked, and
    torch's caching pinned allocator (which rounds up to powers of two) untouched."""
    layers = kv_cache("LBNHC", device, seed=0)
    layout = BlockLayout.of(layers, 0)
    num_blocks = odd_pool_blocks(layout, device)
    pinned = device == "cuda"
    allocator_before = _host_allocator_bytes() if pinned else None
    host_buffer = HostBuffer(layout, num_blocks, pin_memory=pinned)
    expected = num_blocks * layout.bytes_per_block
    report = {
        "applies": pinned,
        "nbytes": host_buffer.nbytes,
        "expected_bytes": expected,
        "registered_bytes": host_buffer.registered_bytes,
        "num_blocks": num_blocks,
    }
    if pinned:
        report["page_locked"] = bool(host_buffer.storage.is_pinned())
        allocator_after = _host_allocator_bytes()
        report["allocator_growth_bytes"] = (
            None if allocator_before is None else allocator_after - allocator_before
        )
        report["ok"] = (
            host_buffer.registered_bytes == expected == host_buffer.nbytes
            and report["page_locked"]
            and report["allocator_growth_bytes"] in (0, None)
        )
    else:
        report["ok"] = host_buffer.nbytes == expected
    return report, host_buffer


def _host_allocator_bytes() -> int | None:
    """Bytes torch's caching pinned allocator holds; None where this torch cannot say."""
    stats_of = getattr(torch.cuda, "host_memory_stats", None)
    stats = stats_of() if stats_of is not None else {}
    for key in ("allocated_bytes.current", "reserved_bytes.current"):
        if key in stats:
            return int(stats[key])
    return None


SMALL_POOL_BLOCKS: Final = 33
"""Host blocks of the other layouts' pools: also not a power of two, and quick to register."""


def pool_for(layout: BlockLayout, device: str, pools: dict[tuple, HostBuffer]) -> HostBuffer:
    """One registered host pool per host layout, reused by that layout's round trips."""
    key = (layout.layer_block_shape, layout.block_order, layout.block_major, layout.num_layers)
    if key not in pools:
        pools[key] = HostBuffer(layout, SMALL_POOL_BLOCKS, pin_memory=device == "cuda")
    return pools[key]


def pool_key(host_buffer: HostBuffer) -> tuple:
    layout = host_buffer.layout
    return (layout.layer_block_shape, layout.block_order, layout.block_major, layout.num_layers)


def check_round_trip(
    device: str, name: str, scattered: bool, pools: dict[tuple, HostBuffer]
) -> dict:
    """Store blocks, load them into other blocks: equal bytes there, nothing else touched.

    The host ids include the pool's last block, so the end of the registration is used.
    """
    layers = kv_cache(name, device, seed=1)
    num_blocks = layers[0].shape[0]
    host_buffer = pool_for(BlockLayout.of(layers, 0), device, pools)
    last = host_buffer.num_blocks - 1
    sources = [5, 61, 2, 30, 17, 8] if scattered else [10, 11, 12, 13, 14, 15]
    targets = [40, 3, 50, 22, 9, 33] if scattered else [40, 41, 42, 43, 44, 45]
    hosts = [last, 1, 20, 2, 3, last - 7] if scattered else [last - 5 + n for n in range(6)]
    expected = [block_bits(layers, b) for b in sources]
    others = [b for b in range(num_blocks) if b not in targets]
    before = {b: block_bits(layers, b) for b in others}
    engine = make_copy_engine(layers, host_buffer, 0)
    engine.wait(engine.submit_store(sources, hosts))
    engine.wait(engine.submit_load(targets, hosts))
    results = engine.poll()
    engine.shutdown()
    exact = all(
        torch.equal(block_bits(layers, t), e) for t, e in zip(targets, expected, strict=True)
    )
    untouched = all(torch.equal(block_bits(layers, b), before[b]) for b in others)
    errors = [r.error for r in results if not r.ok]
    return {
        "layout": name,
        "scattered": scattered,
        "ok": exact and untouched and not errors,
        "byte_exact": exact,
        "others_untouched": untouched,
        "errors": errors,
        "copies": [r.num_copies for r in results],
        "host_blocks": host_buffer.num_blocks,
        "pinned": host_buffer.pinned,
    }


def engine_for(name: str, device: str, num_host_blocks: int) -> CopyEngine:
    layers = kv_cache(name, device, seed=2)
    host_buffer = HostBuffer(BlockLayout.of(layers, 0), num_host_blocks, device == "cuda")
    return make_copy_engine(layers, host_buffer, 0)


def check_no_host_sync(device: str) -> dict:
    """Submitting and polling never wait for the GPU: torch raises on any synchronising call."""
    if device != "cuda":
        return {"ok": True, "applies": False}
    engine = engine_for("LBNHC", device, num_host_blocks=32)
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
    engine = engine_for("LBNHC", device, num_host_blocks=48)
    ids = torch.randperm(64, generator=torch.Generator().manual_seed(1))[:48].tolist()
    engine.wait(engine.submit_store(ids, list(range(48))))  # warm-up: both streams, once
    engine.wait(engine.submit_load(ids, list(range(48))))
    engine.poll()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(5):
        engine.submit_store(ids, list(range(48)))
        engine.submit_load(ids[::-1], list(range(48)))
    engine.drain()
    growth = torch.cuda.max_memory_allocated() - baseline
    engine.shutdown()
    return {"ok": growth == 0, "applies": True, "peak_growth_bytes": int(growth)}


GATED: Final = ("pinned_pool", "no_host_sync", "no_memory_growth", "overlap", "decode")
"""The checks besides the round trips that decide the verdict."""


def run(device: str, load_mib: int, out: Path | None = None) -> dict:
    """Every check in turn; the report so far is written to `out` after each, so a step that
    crashes the process (a CUDA error) leaves the earlier ones on disk."""
    report: dict = {"device": device, "torch": torch.__version__, "ok": False}
    save(report, out)
    pinned_pool, odd_pool = check_pinned_pool(device)
    report["pinned_pool"] = pinned_pool
    save(report, out)
    pools = {pool_key(odd_pool): odd_pool}  # the LBNHC round trips use the 1.5 GiB pool
    report["round_trips"] = []
    for name in ROUND_TRIP_LAYOUTS:
        for scattered in (False, True):
            report["round_trips"].append(check_round_trip(device, name, scattered, pools))
            save(report, out)
    for host_buffer in pools.values():
        host_buffer.close()
    steps = {
        "no_host_sync": lambda: check_no_host_sync(device),
        "no_memory_growth": lambda: check_no_memory_growth(device),
        "overlap": lambda: check_overlap(device, load_mib),
        "decode": lambda: check_decode_slowdown(device),
    }
    for name, check in steps.items():
        try:
            report[name] = check()
        except Exception as exc:  # the next checks still run; the verdict fails
            report[name] = {"ok": False, "applies": True, "error": f"{type(exc).__name__}: {exc}"}
        save(report, out)
    report["ok"] = all(r["ok"] for r in report["round_trips"]) and all(
        report[name]["ok"] for name in GATED
    )
    save(report, out)
    return report


def save(report: dict, out: Path | None) -> None:
    """The report so far, replaced whole (write, then rename: never half a file)."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    partial.write_text(json.dumps(report, indent=2))
    partial.replace(out)


def print_summary(report: dict) -> None:
    for trip in report["round_trips"]:
        kind = "scattered" if trip["scattered"] else "contiguous"
        state = "ok" if trip["ok"] else f"FAIL {trip['errors']}"
        print(f"round trip {trip['layout']:<10} {kind:<10} copies {trip['copies']} {state}")
    pool = report["pinned_pool"]
    print(
        f"pinned pool {pool['nbytes']} bytes ({pool['num_blocks']} blocks), registered "
        f"{pool['registered_bytes']}: {'ok' if pool['ok'] else 'FAIL'}"
    )
    for name in ("no_host_sync", "no_memory_growth"):
        check = report[name]
        state = ("ok" if check["ok"] else "FAIL") if check["applies"] else "n/a on the CPU"
        print(f"{name:<18} {state} {check.get('error') or check.get('peak_growth_bytes', '')}")
    print(f"verdict {'PASS' if report['ok'] else 'FAIL'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--load-mib", type=int, default=256, help="the overlap check's load")
    parser.add_argument("--out", type=Path, help="JSON file for the results")
    args = parser.parse_args(argv)
    report = run(args.device, args.load_mib, args.out)
    print_summary(report)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
