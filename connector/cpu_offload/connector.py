"""CpuOffloadConnector: the CPU offload connector as users load it, every hook traced."""

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole, SupportsHMA

from kvscope.connector.cpu_offload.core import CpuOffloadCore
from kvscope.traces.instrumented import InstrumentedConnector

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig


class CpuOffloadConnector(InstrumentedConnector, SupportsHMA):
    """CpuOffloadCore inside the hook-span instrumentation; every KV cache group of full or
    sliding-window attention (vLLM's hybrid KV cache manager) is offloaded.

    kv_transfer_config = {
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 30, "lease_timeout_s": 30},
    }
    """

    def build_inner(
        self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"
    ) -> CpuOffloadCore:
        return CpuOffloadCore(vllm_config, role, kv_cache_config)

    @classmethod
    def inner_class(cls, extra_config: dict[str, Any]) -> type[CpuOffloadCore]:
        return CpuOffloadCore

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return CpuOffloadCore.build_kv_connector_stats(data)
