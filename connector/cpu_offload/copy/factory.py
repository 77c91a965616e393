"""Picks the copy engine for the KV's device: CUDA streams on a CUDA device, else a CPU thread."""

from collections.abc import Sequence

import torch

from kvscope.connector.cpu_offload.copy.cpu import CpuCopyEngine
from kvscope.connector.cpu_offload.copy.cuda import CudaCopyEngine
from kvscope.connector.cpu_offload.copy.engine import CopyEngine
from kvscope.connector.cpu_offload.copy.host_buffer import HostBuffer


def make_copy_engine(
    kv_layers: Sequence[torch.Tensor],
    host_buffer: HostBuffer,
    block_dim: int,
    cpu_threads: int | None = 1,
) -> CopyEngine:
    """The CUDA backend for KV on a CUDA device, else the CPU (background thread) backend."""
    if kv_layers and kv_layers[0].device.type == "cuda":
        return CudaCopyEngine(kv_layers, host_buffer, block_dim)
    return CpuCopyEngine(kv_layers, host_buffer, block_dim, cpu_threads)
