"""Page-locking pageable host memory with cudaHostRegister, in chunks, through torch alone."""

import logging
from dataclasses import dataclass
from typing import Final

import torch

logger = logging.getLogger(__name__)

REGISTER_CHUNK_BYTES: Final = 2**30
"""Bytes per cudaHostRegister call: bounded, as vLLM bounds them, to stay clear of driver
limits on one registration; a multiple of the page size, so no page is registered twice."""


@dataclass(frozen=True)
class PinnedRange:
    """One registered range of host memory."""

    address: int
    num_bytes: int


def pin_range(address: int, num_bytes: int) -> list[PinnedRange]:
    """Registers [address, address + num_bytes) chunk by chunk; [] if the driver refuses.

    A refusal (not enough lockable memory: ulimit -l, or the host is short) leaves the
    memory pageable and every range unregistered: copies still work, synchronously.
    """
    cudart = torch.cuda.cudart()
    pinned: list[PinnedRange] = []
    for offset in range(0, num_bytes, REGISTER_CHUNK_BYTES):
        chunk = PinnedRange(address + offset, min(REGISTER_CHUNK_BYTES, num_bytes - offset))
        error = _code(cudart.cudaHostRegister(chunk.address, chunk.num_bytes, 0))
        if error != 0:
            logger.warning(
                "cudaHostRegister failed (error %d) at %.2f of %.2f GiB: the host KV buffer "
                "stays pageable and copies will block; lower cpu_bytes_to_use or raise the "
                "locked-memory limit (ulimit -l)",
                error,
                offset / 2**30,
                num_bytes / 2**30,
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
    cudart = torch.cuda.cudart()
    while pinned:
        chunk = pinned.pop()
        error = _code(cudart.cudaHostUnregister(chunk.address))
        if error != 0:
            logger.warning("cudaHostUnregister failed (error %d)", error)
    del memory


def _code(error: object) -> int:
    """torch's cudart returns an enum whose .value is the CUDA error number."""
    return int(getattr(error, "value", error))
