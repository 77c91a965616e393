"""A host pool the machine cannot hold is refused at start, naming cpu_bytes_to_use, before any
page of it exists: a private pool beyond the available memory less the headroom, a shared replica
pool beyond /dev/shm's free space (vLLM's own check of /dev/shm)."""

import shutil

import psutil
import pytest
import torch

pytest.importorskip("vllm")

from kvscope.connector.cpu_offload.config import OffloadConfig  # noqa: E402
from kvscope.connector.cpu_offload.faults import FaultInjector  # noqa: E402
from kvscope.connector.cpu_offload.memory_checks import check_private_pool  # noqa: E402
from kvscope.connector.cpu_offload.replicas import SHARED_MEMORY_DIR, ReplicaGroup  # noqa: E402
from kvscope.connector.cpu_offload.worker import OffloadWorker  # noqa: E402

NUM_BLOCKS = 16


def kv_caches() -> dict[str, torch.Tensor]:
    kv = torch.zeros(2, NUM_BLOCKS, 2, 32, 32, dtype=torch.bfloat16)
    return {"layer.0": kv[0], "layer.1": kv[1]}


def test_a_private_pool_larger_than_the_free_memory_is_refused_before_it_is_allocated():
    too_big = 2 * psutil.virtual_memory().total
    worker = OffloadWorker(OffloadConfig(cpu_bytes_to_use=too_big), FaultInjector(), NUM_BLOCKS)
    with pytest.raises(ValueError, match="does not fit.*lower cpu_bytes_to_use"):
        worker.register(kv_caches())
    assert worker.copies is None, "a copy engine started over a pool that cannot exist"


def test_the_headroom_is_kept_free():
    available = psutil.virtual_memory().available
    with pytest.raises(ValueError, match="GiB must stay free"):
        check_private_pool(available - 2**20)
    check_private_pool(2**20)


def test_a_shared_replica_pool_larger_than_dev_shm_is_refused_before_its_file_exists():
    if not SHARED_MEMORY_DIR.is_dir():
        pytest.skip(f"no {SHARED_MEMORY_DIR} here")
    name = "kvscope-offload-test-too-big"
    leader = ReplicaGroup(size=2, leader=True, name=name, rank=0)
    numel = shutil.disk_usage(SHARED_MEMORY_DIR).free // 2 + 2**20  # bf16: twice the bytes
    with pytest.raises(ValueError, match=f"Insufficient space in {SHARED_MEMORY_DIR}.*cpu_bytes"):
        leader.host_memory(numel, torch.bfloat16)
    assert not list(SHARED_MEMORY_DIR.glob(f"{name}*")), "the pool's file was created"
