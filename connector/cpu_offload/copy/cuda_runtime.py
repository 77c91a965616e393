"""The CUDA runtime's host-registration calls over ctypes, from the libcudart torch loaded.

torch's `cudart()` binds cudaHostRegister but not cudaGetLastError, which a refused
registration needs (see host_pinning); vLLM's CudaRTLibrary binds both the same way, but the copy
path must also run where only torch is installed (bench/gpu_check.sh on the GPU machine).
"""

import ctypes
from pathlib import Path

import torch


class CudaRuntime:
    """cudaHostRegister, cudaHostUnregister, cudaGetLastError, cudaGetErrorString."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        self._lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        self._lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        self._lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        self._lib.cudaGetErrorString.restype = ctypes.c_char_p
        for name in ("cudaHostRegister", "cudaHostUnregister", "cudaGetLastError"):
            getattr(self._lib, name).restype = ctypes.c_int

    def cudaHostRegister(self, ptr: int, size: int, flags: int = 0) -> int:
        return self._lib.cudaHostRegister(ctypes.c_void_p(ptr), size, flags)

    def cudaHostUnregister(self, ptr: int) -> int:
        return self._lib.cudaHostUnregister(ctypes.c_void_p(ptr))

    def cudaGetLastError(self) -> int:
        """Returns and clears the error pending on this thread."""
        return self._lib.cudaGetLastError()

    def cudaGetErrorString(self, error: int) -> str:
        return self._lib.cudaGetErrorString(error).decode()


def load_cuda_runtime() -> CudaRuntime:
    """The libcudart already in the process (torch's), so that errors are the ones its
    launches see; raises OSError if there is none."""
    torch.cuda.init()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if line.count("/") else ""
        if "libcudart" in Path(path).name:
            return CudaRuntime(ctypes.CDLL(path))
    return CudaRuntime(ctypes.CDLL("libcudart.so"))
