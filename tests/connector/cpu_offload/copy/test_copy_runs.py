"""Copies per job over vLLM's views: one a layer run (LB*C), one a run (BL*C), rare gathers."""

# Counted as the tensor operations torch really dispatches. A gather happens only where blocks
# are not dense (LHBNC, BHLNC) or a run breaks into many short device ranges.

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from kvscope.bench.transfer.kv_views import KVShape, vllm_kv_layers
from kvscope.connector.cpu_offload.copy.cpu import CpuCopyEngine
from kvscope.connector.cpu_offload.copy.cpu_rows import RowTables, load_rows, store_rows
from kvscope.connector.cpu_offload.copy.cuda import CudaCopyEngine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer
from kvscope.connector.cpu_offload.copy.plan import plan_runs, split_scattered
from tests.connector.cpu_offload.copy.fake_streams import FakeGpu

COPY_OPS = {"copy_", "index_select", "index_copy_", "index_copy"}
NUM_LAYERS = 3


class CopyCounter(TorchDispatchMode):
    """Counts the copy kernels (copy_, gathers, scatters) torch dispatches while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in COPY_OPS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def copies_of(engine, direction: str, device_ids: list[int], host_ids: list[int]) -> int:
    """The copies a job reports; on the fake GPU (which copies at submit, on this thread)
    checked against the kernels torch dispatched."""
    submit = engine.submit_store if direction == "store" else engine.submit_load
    with CopyCounter() as counter:
        submit(device_ids, host_ids)
    if isinstance(engine, CudaCopyEngine):
        engine.ops.run_all()
    [result] = engine.drain(timeout_s=10)
    assert result.ok, result.error
    if isinstance(engine, CudaCopyEngine):
        assert result.num_copies == counter.count, "a job reports the copies it made"
    return result.num_copies


# (layout, device ids, host ids, copies): one run of 4 blocks; two device ranges into one host
# run (no gather); blocks not dense on the device: a gather and a copy per layer.
CASES = [
    ("LBHNC", [3, 4, 5, 6], [0, 1, 2, 3], NUM_LAYERS),
    ("LBNHC", [3, 4, 5, 6], [0, 1, 2, 3], NUM_LAYERS),
    ("LBHNC/k16", [3, 4, 5, 6], [0, 1, 2, 3], NUM_LAYERS),
    ("LBHNC", [3, 4, 10, 11], [0, 1, 2, 3], 2 * NUM_LAYERS),
    ("BLNHC", [3, 4, 5, 6], [0, 1, 2, 3], 1),
    ("BLHNC", [3, 4, 5, 6], [0, 1, 2, 3], 1),
    ("BLNHC", [3, 4, 10, 11], [0, 1, 2, 3], 2),
    ("BLNHC", [3, 4, 5, 6], [0, 1, 5, 6], 2),
    ("LHBNC", [3, 4, 5, 6], [0, 1, 2, 3], 2 * NUM_LAYERS),
]


@pytest.mark.parametrize("direction", ["store", "load"])
@pytest.mark.parametrize(("layout", "device_ids", "host_ids", "expected"), CASES)
def test_dense_runs_are_merged_into_one_copy_each(
    layout, device_ids, host_ids, expected, direction, make_kv_cache, make_host_buffer
):
    kv = make_kv_cache(layout)
    host_buffer = make_host_buffer(kv, num_host_blocks=8)
    engine = CudaCopyEngine(kv.layers, host_buffer, kv.block_dim, ops=FakeGpu())
    assert copies_of(engine, direction, device_ids, host_ids) == expected


@pytest.mark.parametrize("layout", ["LBHNC", "BLNHC"])
def test_the_cpu_engine_copies_dense_runs_the_same_way(layout, make_kv_cache, make_host_buffer):
    kv = make_kv_cache(layout)
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, num_host_blocks=8), 0) as engine:
        expected = NUM_LAYERS if layout == "LBHNC" else 1
        assert copies_of(engine, "store", [7, 8, 9], [2, 3, 4]) == expected
        assert copies_of(engine, "load", [1, 2, 3], [2, 3, 4]) == expected


def test_many_device_ranges_are_gathered_not_copied_one_by_one(make_kv_cache, make_host_buffer):
    kv = make_kv_cache("BLNHC")
    host_buffer = make_host_buffer(kv, num_host_blocks=8)
    engine = CudaCopyEngine(kv.layers, host_buffer, kv.block_dim, ops=FakeGpu())
    scattered = [1, 5, 9, 13, 17, 21]  # six ranges of one block: the ids, a gather, a copy
    assert copies_of(engine, "store", scattered, list(range(6))) == 3
    for position, device_block_id in enumerate(scattered):
        stored = host_buffer.block(position).contiguous().view(torch.int16)
        assert torch.equal(stored, kv.block_bits(device_block_id)), "byte-exact"


@pytest.mark.parametrize(("range_blocks", "expected"), [(2, 6 * 2), (1, 1 + 2 * 2)])
def test_long_device_ranges_are_copied_directly_short_ones_gathered(range_blocks, expected):
    """Six device ranges into one host run, 128 KiB pages: ranges of 256 KiB are memcpys
    (six a layer), ranges of one page are gathered (the ids, then a gather and a copy a layer)."""
    kv = KVShape(num_layers=2, num_blocks=64, num_kv_heads=8, block_size=32, head_size=128)
    layers = vllm_kv_layers("LBHNC", kv)
    host_buffer = HostBuffer(BlockLayout.of(layers, 0), 16)
    engine = CudaCopyEngine(layers, host_buffer, 0, ops=FakeGpu())
    device_ids = [start + n for start in (40, 3, 20, 50, 9, 30) for n in range(range_blocks)]
    host_ids = list(range(len(device_ids)))
    assert copies_of(engine, "load", device_ids, host_ids) == expected


class TorchCalls(TorchFunctionMode):
    """Torch calls made from Python while active, by name; slicing (t[a:b]) apart, as the
    binding does it without letting go of the GIL."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not torch.Tensor.__getitem__:
            self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("layout", ["LBHNC", "BLNHC", "LBNHC/k16"])
@pytest.mark.parametrize("copy_rows", [store_rows, load_rows])
def test_on_the_cpu_a_jobs_range_copies_are_one_torch_call(
    layout, copy_rows, make_kv_cache, make_host_buffer
):
    """Each torch call makes the copy thread win the GIL back from the engine's thread (up to
    5 ms while it runs Python): a job's ranges, every layer, go in one call."""
    kv = make_kv_cache(layout)
    engine = CpuCopyEngine(kv.layers, make_host_buffer(kv, num_host_blocks=8), 0)
    engine.shutdown()
    tables = RowTables.of(engine.device_tables, engine.host_tables)
    runs = plan_runs([3, 4, 10, 11, 12], [0, 1, 2, 5, 6], kv.num_blocks, 8)
    runs = split_scattered(runs, engine._row_bytes)  # as the engine plans a job
    with TorchCalls() as calls:
        num_copies = copy_rows(tables, runs)
    assert calls.names == ["_foreach_copy_"]
    assert num_copies == 3 * len(engine.device_tables), "three ranges, every table"


@pytest.mark.parametrize("copy_rows", [store_rows, load_rows])
def test_on_the_cpu_a_gather_is_one_torch_call_a_table(copy_rows):
    kv = KVShape(num_layers=2, num_blocks=64, num_kv_heads=8, block_size=32, head_size=128)
    layers = vllm_kv_layers("LBHNC", kv)
    engine = CpuCopyEngine(layers, HostBuffer(BlockLayout.of(layers, 0), 16), 0)
    engine.shutdown()
    tables = RowTables.of(engine.device_tables, engine.host_tables)
    scattered = [1, 5, 9, 13, 17, 21]  # six ranges of one 128 KiB page: gathered
    runs = split_scattered(plan_runs(scattered, range(6), 64, 16), engine._row_bytes)
    with TorchCalls() as calls:
        assert copy_rows(tables, runs) == 2
    assert len(calls.names) == 2 and "_foreach_copy_" not in calls.names


@pytest.mark.parametrize("layout", ["LBHNC", "BLNHC", "LHBNC"])
def test_the_cpu_engine_round_trips_ranges_and_gathers_in_one_job(
    layout, make_kv_cache, make_host_buffer
):
    kv = make_kv_cache(layout)
    device_ids = [2, 3, 9, 4, 15, 20, 6]  # ranges, and single blocks between them
    host_ids = [0, 1, 2, 3, 4, 5, 7]
    with CpuCopyEngine(kv.layers, make_host_buffer(kv, num_host_blocks=8), kv.block_dim) as e:
        e.wait(e.submit_store(device_ids, host_ids), timeout_s=10)
        originals = {d: kv.block_bits(d).clone() for d in device_ids}
        for layer in kv.layers:
            layer.zero_()
        e.wait(e.submit_load(device_ids, host_ids), timeout_s=10)
        assert all(result.ok for result in e.poll())
    for device_block_id, bits in originals.items():
        assert torch.equal(kv.block_bits(device_block_id), bits), "byte-exact"
