"""Page-locking pageable host memory in chunks that end on block boundaries, as vLLM does.

A refused cudaHostRegister leaves an error pending on the thread, which the next kernel launch
there (in vLLM: warm-up or graph capture) would raise: it is cleared with cudaGetLastError, as
vLLM's own offloader clears it (`vllm/v1/kv_offload/cpu/host_register.py`).
"""

import functools
import logging
from dataclasses import dataclass
from typing import Final

from kvscope.connector.cpu_offload.copy.cuda_runtime import CudaRuntime, load_cuda_runtime

logger = logging.getLogger(__name__)

REGISTER_CHUNK_BYTES: Final = 2**30
"""Most bytes per registration: bounded, as vLLM bounds them, to stay clear of driver limits on
one registration. A chunk holds whole blocks, so no block copy straddles two registrations."""


@dataclass(frozen=True)
class PinnedRange:
    """One registered range of host memory."""

    address: int
    num_bytes: int


def chunk_blocks(block_bytes: int) -> int:
    """Blocks per registration chunk: as many whole blocks as REGISTER_CHUNK_BYTES holds."""
    return max(REGISTER_CHUNK_BYTES // block_bytes, 1)


def pin_tables(tables: list[tuple[int, int]], block_bytes: int) -> list[PinnedRange]:
    """Registers each table (address, num_blocks) of blocks `block_bytes` apart in chunks of
    chunk_blocks(block_bytes) blocks; [] (every range rolled back) if the driver refuses one.

    A refusal (the locked-memory limit, a container's limits, a sandboxed GPU runtime, a pool
    larger than the host can lock) leaves the memory pageable: copies still work, synchronously.
    """
    cudart = _cudart()
    step = chunk_blocks(block_bytes)
    total = sum(num_blocks for _, num_blocks in tables) * block_bytes
    pinned: list[PinnedRange] = []
    for address, num_blocks in tables:
        for first in range(0, num_blocks, step):
            chunk = PinnedRange(
                address + first * block_bytes, min(step, num_blocks - first) * block_bytes
            )
            error = cudart.cudaHostRegister(chunk.address, chunk.num_bytes, 0)
            if error != 0:
                cudart.cudaGetLastError()  # else the next launch on this thread raises it
                logger.warning(
                    "kvscope offload: cudaHostRegister refused %.2f GiB of the %.2f GiB host KV"
                    " pool (%s): the pool stays pageable and copies block the step; lower"
                    " cpu_bytes_to_use or raise the locked-memory limit (ulimit -l, the"
                    " container's memlock)",
                    (total - sum(r.num_bytes for r in pinned)) / 2**30,
                    total / 2**30,
                    cudart.cudaGetErrorString(error),
                )
                unpin_ranges(pinned)
                return []
            pinned.append(chunk)
    return pinned


def unpin_ranges(pinned: list[PinnedRange], memory: object = None) -> None:
    """Unregisters every range, newest first, and forgets them.

    memory is the tensor the ranges lie in: a finalizer passes it so the memory outlives
    its registration.
    """
    if not pinned:
        return
    cudart = _cudart()
    while pinned:
        error = cudart.cudaHostUnregister(pinned.pop().address)
        if error != 0:
            cudart.cudaGetLastError()
            logger.warning("cudaHostUnregister failed: %s", cudart.cudaGetErrorString(error))
    del memory


@functools.cache
def _cudart() -> CudaRuntime:
    return load_cuda_runtime()
