"""vLLM 0.34's VMM driver interface over host memory, so its extensible KV cache runs on the CPU.

`HostVmmDriver` does with mmap what CUDA's `cuMem*` calls do with device memory: a reservation
is address space with no access (PROT_NONE, MAP_NORESERVE), a physical chunk is a memfd of its
size, mapping it puts the file at a fixed address in the reservation, access makes it readable
and writable, and unmapping puts the reservation back. vLLM's own `ExtensibleTensor` and
`ExtensibleKVCache` run over it unchanged: `host_vmm()` puts it where `extensible_tensor` looks
its driver up, and `DEVICE` is the CUDA device those classes insist on (they only record its
index; the tensors they view are kDLCPU, so torch sees host memory).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final
from unittest import mock

import torch
from vllm.utils import extensible_tensor
from vllm.utils.vmm_driver import VmmDriver

DEVICE: Final = torch.device("cuda", 0)
"""What ExtensibleTensor is given: it refuses other device types and keeps only the index."""
GRANULARITY: Final = 2 << 20
"""CUDA's VMM granularity on Hopper (and vLLM's floor for every driver)."""
_PROT_NONE: Final = 0
_MAP_NORESERVE: Final = 0x4000
_MAP_FIXED: Final = 0x10
_MAP_FAILED: Final = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class HostVmmDriver(VmmDriver):
    """A VmmDriver whose reservations, chunks and mappings are host memory (handles: memfds)."""

    dlpack_device_type = 1  # kDLCPU

    def __init__(self) -> None:  # no driver library to load
        self._fns = {}
        self.mapped: dict[int, int] = {}  # address -> size of each physical chunk mapped now

    def chunks_under(self, address: int, length: int) -> int:
        """How many mapped physical chunks the byte range [address, address + length) touches
        (0 where it is not mapped; 1 where one allocation holds it, as RDMA registration needs)."""
        return sum(
            start < address + length and address < start + size
            for start, size in self.mapped.items()
        )

    def ensure_context(self, device_index: int) -> None:
        return None

    def granularity(self, device_index: int) -> int:
        return GRANULARITY

    def reserve(self, size: int) -> int:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        return _mmap(None, size, _PROT_NONE, flags, -1)

    def free_reserved(self, ptr: int, size: int) -> None:
        _check(_libc.munmap(ptr, size), "munmap")

    def create(self, size: int, device_index: int, export_handle_types: int = 0) -> int:
        handle = os.memfd_create("kvscope-kv-chunk", os.MFD_CLOEXEC)
        os.ftruncate(handle, size)
        return handle

    def map(self, ptr: int, size: int, handle: int) -> None:
        _mmap(ptr, size, _PROT_NONE, mmap.MAP_SHARED | _MAP_FIXED, handle)
        self.mapped[ptr] = size

    def set_access(self, ptr: int, size: int, device_index: int) -> None:
        _check(_libc.mprotect(ptr, size, mmap.PROT_READ | mmap.PROT_WRITE), "mprotect")

    def unmap(self, ptr: int, size: int) -> None:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED
        _mmap(ptr, size, _PROT_NONE, flags, -1)
        self.mapped.pop(ptr, None)

    def release(self, handle: int) -> None:
        os.close(handle)


HOST_DRIVER: Final = HostVmmDriver()
"""The one host driver (vLLM keeps one driver per process too)."""


@contextmanager
def host_vmm() -> Iterator[HostVmmDriver]:
    """vLLM's extensible tensors over host memory within the context: its driver lookup answers
    HOST_DRIVER, and torch's device synchronize, which vLLM calls before unmapping chunks, is a
    no-op where torch has no accelerator (host memory has no queued device work to wait for)."""
    synchronize = torch.accelerator.synchronize

    def synchronize_if_any(device: object = None) -> None:
        if torch.accelerator.is_available():
            synchronize(device)

    with (
        mock.patch.object(extensible_tensor, "get_vmm_driver", lambda: HOST_DRIVER),
        mock.patch.object(torch.accelerator, "synchronize", synchronize_if_any),
    ):
        yield HOST_DRIVER


def _mmap(address: int | None, size: int, prot: int, flags: int, fd: int) -> int:
    result = _libc.mmap(address, size, prot, flags, fd, 0)
    if result in (None, _MAP_FAILED):
        raise RuntimeError(f"mmap failed: {os.strerror(ctypes.get_errno())}")
    if address is not None and result != address:
        raise RuntimeError(f"mmap placed {size} bytes at {result:#x}, not {address:#x}")
    return result


def _check(result: int, call: str) -> None:
    if result != 0:
        raise RuntimeError(f"{call} failed: {os.strerror(ctypes.get_errno())}")
