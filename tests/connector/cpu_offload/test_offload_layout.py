"""The offload connector's KV cache layout preference, through vLLM's own resolution
(resolve_kv_cache_layout asks the connector class vLLM's factory loads): LBHNC on CUDA-alike
devices, none on the CPU platform or for MLA, and inside a Multi beside P2P it gives way."""

from types import SimpleNamespace

import pytest
from vllm.config import CacheConfig, KVTransferConfig
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

from kvscope.connector.cpu_offload import layout
from kvscope.connector.cpu_offload.core import CpuOffloadCore
from kvscope.connector.p2p import vllm_layout
from kvscope.harness import configs
from tests.connector.hook_orders import offload_extra, offload_transfer
from tests.vllm_release import on_cpu_platform

CUDA_LAYOUTS = ["LBNHC", "LBHNC", "BLNHC", "BLHNC"]
"""Candidates as a CUDA backend lists them, most preferred first (LBNHC: vLLM's default)."""


def resolve(transfer: KVTransferConfig, supported: list[str], use_mla: bool = False) -> str:
    config = SimpleNamespace(
        cache_config=CacheConfig(),
        kv_transfer_config=transfer,
        model_config=SimpleNamespace(use_mla=use_mla),
    )
    return resolve_kv_cache_layout(config, [supported]).name


def offload_and_p2p() -> KVTransferConfig:
    children = [
        configs.offload_child(**offload_extra()),
        configs.child("p2p", configs.P2P_CLASS, configs.P2P_MODULE),
    ]
    return KVTransferConfig(**configs.multi_config(*children, policy="fail"))


@pytest.fixture
def on_cuda(monkeypatch):
    """Both connectors answer as on a CUDA-alike platform."""
    monkeypatch.setattr(layout, "_platform_is_cpu", lambda: False)
    monkeypatch.setattr(vllm_layout, "_platform_is_cpu", lambda: False)


@on_cpu_platform
def test_no_preference_on_the_cpu_platform():
    assert resolve(offload_transfer(), ["LBHNC"]) == "LBHNC"
    config = SimpleNamespace(
        kv_transfer_config=offload_transfer(), model_config=SimpleNamespace(use_mla=False)
    )
    assert CpuOffloadCore.get_required_kvcache_layout(config) is None


def test_lbhnc_on_cuda_and_none_for_mla(on_cuda):
    assert resolve(offload_transfer(), CUDA_LAYOUTS) == "LBHNC"
    assert resolve(offload_transfer(), CUDA_LAYOUTS, use_mla=True) == "LBNHC"
    assert resolve(offload_transfer(kv_cache_layout="none"), CUDA_LAYOUTS) == "LBNHC"
    assert resolve(offload_transfer(kv_cache_layout="BLHNC"), CUDA_LAYOUTS) == "BLHNC"


def test_inside_a_multi_with_p2p_the_offload_gives_way(on_cuda):
    assert CpuOffloadCore.yields_kv_cache_layout()
    assert resolve(offload_and_p2p(), CUDA_LAYOUTS) == "BLNHC"
