"""The host buffer: exact size, page-aligned, never zeroed at start, in the device's byte order."""

import os
import time

import pytest

from kvscope.connector.cpu_offload.copy.host_buffer import PAGE_BYTES, BlockLayout, HostBuffer


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_pool_of_odd_size_takes_exactly_its_bytes_and_no_page_until_used(make_kv_cache):
    kv = make_kv_cache("LBHNC")
    layout = BlockLayout.of(kv.layers, 0)
    pool_bytes = (256 * 2**20 // layout.bytes_per_block + 1) * layout.bytes_per_block
    before = resident_bytes()
    started = time.perf_counter()
    host_buffer = HostBuffer.with_capacity(layout, pool_bytes)
    allocate_s = time.perf_counter() - started
    assert host_buffer.num_blocks == pool_bytes // layout.bytes_per_block
    assert host_buffer.nbytes == pool_bytes, "exactly the blocks' bytes, not a power of two"
    assert host_buffer.storage.data_ptr() % PAGE_BYTES == 0, "registration chunks need pages"
    grown = resident_bytes() - before
    assert grown < 32 * 2**20, f"start touched {grown >> 20} MiB of a 256 MiB pool: zeroed?"
    assert allocate_s < 0.5
    assert host_buffer.registered_bytes == 0 and not host_buffer.pinned, "no CUDA here"
    host_buffer.layers[0][5].fill_(1.0)  # a store's first touch brings its pages in
    assert bool((host_buffer.block(5)[0] == 1.0).all())


@pytest.mark.parametrize(
    ("layout", "block_major"),
    [("LBHNC", False), ("LBNHC", False), ("BLNHC", True), ("BLHNC", True)],
)
def test_host_blocks_keep_the_device_order_of_their_bytes(layout, block_major, make_kv_cache):
    kv = make_kv_cache(layout)
    layout_of = BlockLayout.of(kv.layers, 0)
    host_buffer = HostBuffer(layout_of, 5)
    assert layout_of.block_major is block_major
    device_block, host_block = kv.layers[1][0], host_buffer.layers[1][0]
    assert host_block.stride() == device_block.stride(), "same order inside a block"
    [table, *rest] = host_buffer.rows()
    row_bytes = table.shape[1] * table.element_size()
    assert row_bytes == (3 if block_major else 1) * layout_of.bytes_per_layer_block
    assert len(rest) == (0 if block_major else 2)


@pytest.mark.parametrize("layout", ["LHBNC", "BHLNC", "flash"])
def test_blocks_that_are_not_dense_on_the_device_are_held_in_logical_order(layout, make_kv_cache):
    kv = make_kv_cache(layout)
    layout_of = BlockLayout.of(kv.layers, kv.block_dim)
    assert not layout_of.raw_rows
    host_layer = HostBuffer(layout_of, 4).layers[0]
    assert host_layer.is_contiguous()


def test_close_without_cuda_is_harmless_and_idempotent(make_kv_cache):
    kv = make_kv_cache("LBHNC")
    host_buffer = HostBuffer(BlockLayout.of(kv.layers, 0), 4, pin_memory=True)
    host_buffer.close()
    host_buffer.close()
    assert not host_buffer.pinned
