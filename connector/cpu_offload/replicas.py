"""TP ranks that hold identical KV (MLA) share one host pool: the first stores, every rank loads."""

from __future__ import annotations

import contextlib
import itertools
import os
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import torch

from kvscope.connector.cpu_offload.memory_checks import check_shared_pool

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from kvscope.connector.cpu_offload.copy.engine import CopyEngine, CopyResult

SHARED_MEMORY_DIR: Final = Path("/dev/shm")
"""Where the replica groups' pools are mapped from (memory, not disk)."""
LEADER_WAIT_S: Final = 120.0
"""How long a follower waits at register_kv_caches for its leader to create the shared pool."""

_pools_mapped: Counter[tuple[str, int]] = Counter()  # (group name, TP rank) -> pools mapped


@dataclass(frozen=True)
class ReplicaGroup:
    """The ranks this rank shares a host pool with; size 1 is a private pool.

    MLA keeps one latent per layer, the same on every tensor-parallel rank; vLLM marks such ranks
    (`KVCacheConfig.kv_tp_replicas`). Private pools split over the world would hold the same blocks
    R times in R times less room each. Instead the R ranks of a replica group map one shared memory
    file, sized as R ranks' share of `cpu_bytes_to_use`: host memory stays the budget, the pool
    holds R times more blocks, and each block is written once. The scheduler half commits a store
    only when every rank reported it (the followers report theirs at once, the leader when its copy
    ended), and releases a lease only when every rank's load ended, so no rank reads a block another
    rank is writing. vLLM's own offloader does the same (a shared /dev/shm region, rank 0 writes).
    The sharing needs every rank of the group on one host and nothing but TP: otherwise each rank
    keeps a private pool, as before.
    """

    size: int = 1
    leader: bool = True  # the rank whose stores copy; the others' stores only report done
    name: str = ""  # the shared memory file every rank of the group maps (before its count)
    rank: int = 0  # this rank in its TP group

    @classmethod
    def of(
        cls, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, tp_rank: int | None = None
    ) -> ReplicaGroup:
        """This rank's group: vLLM's replicas when they may share memory, else a private pool."""
        replicas = int(getattr(kv_cache_config, "kv_tp_replicas", 1) or 1)
        parallel = vllm_config.parallel_config
        shareable = (
            replicas > 1
            and parallel.world_size == parallel.tensor_parallel_size
            and getattr(parallel, "nnodes_within_dp", 1) == 1
            and parallel.distributed_executor_backend in ("mp", "uni", None)
        )
        if not shareable:
            return cls()
        rank = tensor_parallel_rank() if tp_rank is None else tp_rank
        engine = vllm_config.kv_transfer_config.engine_id
        name = f"kvscope-offload-{engine}-dp{parallel.data_parallel_rank}-g{rank // replicas}"
        return cls(size=replicas, leader=rank % replicas == 0, name=name, rank=rank)

    @property
    def shared(self) -> bool:
        return self.size > 1

    def host_memory(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """The group's shared pool memory (page-aligned, untouched), or None for a private
        pool. The leader creates the file at this size, the followers map it once it is there;
        the leader removes its name when its process ends (the mappings stay valid). Pools are
        counted per rank: every rank registers the same connectors (a Multi's children) in the
        same order, so the n-th pool of each rank is the same one."""
        if not self.shared:
            return None
        count = _pools_mapped[(self.name, self.rank)]
        _pools_mapped[(self.name, self.rank)] += 1
        path = SHARED_MEMORY_DIR / f"{self.name}-{count}"
        if self.leader:
            check_shared_pool(numel * dtype.itemsize, SHARED_MEMORY_DIR)
        else:
            # A follower that mapped a file of its own would skip its stores and load garbage.
            _wait_for_leader(path, numel * dtype.itemsize, LEADER_WAIT_S)
        memory = torch.from_file(str(path), shared=True, size=numel, dtype=dtype)
        if self.leader:
            weakref.finalize(memory, _unlink, path)
        return memory

    def copies(self, engine: CopyEngine) -> CopyEngine | StoresByLeader:
        """The copy engine this rank uses: a follower's stores copy nothing."""
        return StoresByLeader(engine) if self.shared and not self.leader else engine


class StoresByLeader:
    """A follower's copy engine: stores report done at once (the leader writes the shared
    pool), loads and everything else go to the real engine."""

    def __init__(self, engine: CopyEngine):
        self.engine = engine
        self._job_ids = itertools.count(-1, -1)  # the real engine's ids are positive
        self._done: list[CopyResult] = []

    def submit_store(
        self,
        device_block_ids: Sequence[int],
        host_block_ids: Sequence[int],
        delay_s: float = 0.0,
        fail_reason: str | None = None,
    ) -> int:
        from kvscope.connector.cpu_offload.copy.engine import CopyResult, Direction

        job_id, now = next(self._job_ids), time.monotonic()
        self._done.append(
            CopyResult(job_id, Direction.STORE, len(host_block_ids), 0, now, now, 0.0, fail_reason)
        )
        return job_id

    def submit_load(self, *args, **kwargs) -> int:
        return self.engine.submit_load(*args, **kwargs)

    def poll(self) -> list[CopyResult]:
        done, self._done = self._done, []
        return done + self.engine.poll()

    def wait(self, job_id: int, timeout_s: float | None = None) -> bool:
        return job_id < 0 or self.engine.wait(job_id, timeout_s)

    def cancel(self, job_id: int) -> bool:
        return job_id > 0 and self.engine.cancel(job_id)

    def shutdown(self, timeout_s: float | None = None) -> None:
        self.engine.shutdown(timeout_s)


def tensor_parallel_rank() -> int:
    """This worker's rank in its tensor-parallel group (0 outside vLLM's distributed set-up)."""
    from vllm.distributed.parallel_state import get_tp_group

    try:
        return get_tp_group().rank_in_group
    except AssertionError:
        return 0


def _wait_for_leader(path: Path, num_bytes: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not (path.exists() and path.stat().st_size >= num_bytes):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the first TP rank of this replica group did not create the shared host pool "
                f"{path} ({num_bytes} bytes) within {timeout_s:.0f} s: every TP rank of one "
                "engine must run on one host with the same kv_transfer_config (engine_id)"
            )
        time.sleep(0.01)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
