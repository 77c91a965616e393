"""Refusals at start for a host pool this machine cannot hold, before any page of it is touched.

With CUDA every page of a rank's pool is page-locked inside register_kv_caches: a pool larger
than the host's free memory gets the worker killed while it starts. A shared replica pool lives
in /dev/shm, whose pages beyond the mount's size raise SIGBUS when touched (a container's default
is 64 MiB). Both are refused with what to change; a cgroup limit below the pool only warns, as
vLLM's own preflight does (its usage counts reclaimable page cache).
"""

from pathlib import Path
from typing import Final

import psutil

HEADROOM_FRACTION: Final = 0.05
"""Share of the host's memory a private pool must leave free (the engine, other ranks' growth)."""
MIN_HEADROOM_BYTES: Final = 1 << 30
"""The least free memory a private pool must leave."""


def check_private_pool(num_bytes: int) -> None:
    """Refuses a rank's own pool larger than the host's available memory less the headroom."""
    from vllm.utils.cpu_resource_utils import check_cgroup_memory_available

    memory = psutil.virtual_memory()
    headroom = max(MIN_HEADROOM_BYTES, int(memory.total * HEADROOM_FRACTION))
    if num_bytes > memory.available - headroom:
        raise ValueError(
            f"kvscope offload: this rank's host KV pool of {_gib(num_bytes)} GiB does not fit:"
            f" {_gib(memory.available)} GiB of host memory is available and {_gib(headroom)} GiB"
            " must stay free; lower cpu_bytes_to_use (it is split over the ranks)"
        )
    check_cgroup_memory_available(num_bytes, "kvscope's host KV pool")


def check_shared_pool(num_bytes: int, directory: Path) -> None:
    """Refuses a shared replica pool larger than the free space of `directory` (/dev/shm)."""
    from vllm.distributed.device_communicators.shm_broadcast import check_shm_free_space

    try:
        check_shm_free_space(
            num_bytes, str(directory), allocation_name="kvscope's shared host KV pool"
        )
    except RuntimeError as exc:
        raise ValueError(f"kvscope offload: {exc} Or lower cpu_bytes_to_use.") from None


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f}"
