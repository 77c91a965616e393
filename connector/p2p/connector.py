"""P2PConnector: the NIXL prefill/decode connector as users load it, every hook traced.

kv_transfer_config = {
    "kv_connector": "P2PConnector",
    "kv_connector_module_path": "kvscope.connector.p2p.connector",
    "kv_role": "kv_both",
    "kv_load_failure_policy": "recompute",
    "kv_connector_extra_config": {"side_channel_port": 5700, "lease_timeout_s": 30},
}
Other keys: side_channel_host (default 127.0.0.1), lease_margin_s, read_timeout_s,
handshake_timeout_s (see config.P2PConfig), and tier_health: {"failures_to_bypass": 5,
"bypass_s": 2.0, ...} for the breaker of each prefill peer (connector/common/tier_health.py).
"""

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA

from kvscope.connector.p2p.core import P2PCore
from kvscope.traces.instrumented import InstrumentedConnector

if TYPE_CHECKING:
    from vllm.config import KVTransferConfig


class P2PConnector(InstrumentedConnector, SupportsHMA):
    """P2PCore inside the hook-span instrumentation; every KV cache group of full or
    sliding-window attention (vLLM's hybrid KV cache manager) moves."""

    def build_inner(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> P2PCore:
        return P2PCore(vllm_config, role, kv_cache_config)

    @classmethod
    def inner_class(cls, extra_config: dict[str, Any]) -> type[P2PCore]:
        return P2PCore

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: "KVTransferConfig") -> bool:
        """True: P2P re-registers its KV cache after wake-up and tells its readers (P2PCore)."""
        return P2PCore.supports_sleep_mode(kv_transfer_config)

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return P2PCore.build_kv_connector_stats(data)
