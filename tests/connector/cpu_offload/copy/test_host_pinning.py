"""Page-locking the host pool: a refusal clears the CUDA error it leaves, chunks hold whole blocks,
and no copy spans two registrations.

The CUDA runtime is not on this machine: `Runtime` stands in for its four calls (which
connector/cpu_offload/copy/cuda_runtime.py binds over ctypes), with the runtime's own rule that a
failed call leaves its error pending on the thread until cudaGetLastError, and the next launch
raises it. The chunking, the roll-back and the run splits are kvscope's, on real host memory.
bench/gpu_check.sh runs the refusal on CUDA.
"""

import logging

import pytest
import torch

from kvscope.connector.cpu_offload.copy import host_pinning
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer
from kvscope.connector.cpu_offload.copy.plan import CopyRun, split_at_multiples

ERROR_MEMORY_ALLOCATION = 2


class Runtime:
    """The CUDA runtime's host-registration calls, over a table of registered ranges."""

    def __init__(self, refuse_at: int | None = None) -> None:
        self.refuse_at = refuse_at  # the n-th registration fails (0-based)
        self.registered: dict[int, int] = {}
        self.calls = 0
        self.pending = 0

    def cudaHostRegister(self, ptr: int, size: int, flags: int = 0) -> int:
        self.calls += 1
        if self.calls - 1 == self.refuse_at:
            self.pending = ERROR_MEMORY_ALLOCATION
            return ERROR_MEMORY_ALLOCATION
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr: int) -> int:
        return 0 if self.registered.pop(ptr, None) is not None else 712  # not registered

    def cudaGetLastError(self) -> int:
        error, self.pending = self.pending, 0
        return error

    def cudaGetErrorString(self, error: int) -> str:
        return {2: "out of memory", 712: "host memory not registered"}.get(error, str(error))

    def launch(self) -> None:
        """What the next kernel launch on the thread does with an error left pending."""
        if self.pending:
            raise RuntimeError(f"CUDA error: {self.cudaGetErrorString(self.pending)}")


@pytest.fixture
def runtime(monkeypatch):
    def install(refuse_at: int | None = None, chunk_bytes: int | None = None) -> Runtime:
        runtime = Runtime(refuse_at)
        monkeypatch.setattr(host_pinning, "_cudart", lambda: runtime)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        if chunk_bytes is not None:
            monkeypatch.setattr(host_pinning, "REGISTER_CHUNK_BYTES", chunk_bytes)
        return runtime

    return install


def test_a_refused_registration_clears_its_error_and_rolls_back(runtime, make_kv_cache, caplog):
    kv = make_kv_cache("LBHNC")
    layout = BlockLayout.of(kv.layers, 0)
    cuda = runtime(refuse_at=3, chunk_bytes=2 * layout.bytes_per_layer_block)
    with caplog.at_level(logging.WARNING, logger=host_pinning.__name__):
        host_buffer = HostBuffer(layout, 5, pin_memory=True)
    cuda.launch()  # raised "CUDA error: out of memory" before the fix
    assert not host_buffer.pinned and host_buffer.registered_bytes == 0
    assert cuda.registered == {}, "the chunks registered before the refusal stay locked"
    [warning] = caplog.records
    assert "out of memory" in warning.message and "cpu_bytes_to_use" in warning.message
    assert "GiB" in warning.message


@pytest.mark.parametrize("layout_name", ["LBHNC", "BLNHC"])
def test_chunks_hold_whole_blocks_of_each_table(runtime, make_kv_cache, layout_name):
    kv = make_kv_cache(layout_name)
    layout = BlockLayout.of(kv.layers, 0)
    row = layout.bytes_per_block if layout.block_major else layout.bytes_per_layer_block
    cuda = runtime(chunk_bytes=3 * row + row // 2)  # three blocks and a half fit
    host_buffer = HostBuffer(layout, 8, pin_memory=True)
    tables = [t.data_ptr() for t in host_buffer.rows()]
    assert host_buffer.registration_blocks == 3
    expected = {
        table + first * row: min(3, 8 - first) * row for table in tables for first in (0, 3, 6)
    }
    assert cuda.registered == expected, "a chunk cuts through a block"
    assert host_buffer.registered_bytes == host_buffer.nbytes
    host_buffer.close()
    assert cuda.registered == {}


def test_runs_are_cut_at_registration_edges():
    runs = [CopyRun(1, 7, 10), CopyRun(9, 2, None, torch.tensor([4, 2])), CopyRun(12, 2, 0)]
    split = split_at_multiples(runs, 3)
    assert [(r.host_start, r.num_blocks) for r in split] == [
        (1, 2),
        (3, 3),
        (6, 2),
        (9, 2),
        (12, 2),
    ]
    assert [r.device_block_ids.tolist() for r in split[:3]] == [[10, 11], [12, 13, 14], [15, 16]]
    assert split[3].device_block_ids.tolist() == [4, 2]


def test_copies_over_registration_edges_stay_byte_exact(runtime, make_kv_cache):
    kv = make_kv_cache("BLNHC")
    layout = BlockLayout.of(kv.layers, 0)
    runtime(chunk_bytes=2 * layout.bytes_per_block)
    host_buffer = HostBuffer(layout, 8, pin_memory=True)
    device_ids, host_ids = [3, 4, 5, 6, 7], [1, 2, 3, 4, 5]
    with make_copy_engine(kv.layers, host_buffer, 0) as engine:
        engine.submit_store(device_ids, host_ids)
        [stored] = engine.drain(timeout_s=30)
    assert stored.ok, stored.error
    for device_id, host_id in zip(device_ids, host_ids, strict=True):
        stored_bits = host_buffer.block(host_id).contiguous().view(torch.int16)
        assert torch.equal(stored_bits, kv.block_bits(device_id))
