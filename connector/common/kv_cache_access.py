"""vLLM 0.34's KVCacheAccess flags (how a connector's workers reach the device KV cache, which
decides how the extensible KV cache allocates it), where the installed vLLM has them."""

from typing import TYPE_CHECKING, Any

try:
    from vllm.config.kv_transfer import KVCacheAccess
except ImportError:  # vLLM 0.32 and 0.33: no extensible KV cache, and nothing asks
    KVCacheAccess: Any = None

if TYPE_CHECKING:
    from vllm.config.kv_transfer import KVTransferConfig


def configured_access(kv_transfer_config: "KVTransferConfig") -> "KVCacheAccess":
    """The configured connector's answer as vLLM reads it: through its factory, which also
    gives a stock LMCacheMPConnector that predates the question its legacy CUDA IPC."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    return KVConnectorFactory.kv_cache_access(kv_transfer_config)


def lookahead_hashing(cls: type, kv_transfer_config: "KVTransferConfig") -> bool:
    """cls's answer to vLLM 0.34's supports_lookahead_block_hashes; a class written for an
    older vLLM has none, and 0.34's default is False."""
    ask = getattr(cls, "supports_lookahead_block_hashes", None)
    return False if ask is None else bool(ask(kv_transfer_config))
