"""The CPU offload connector's settings, from vLLM's kv_connector_extra_config."""

from dataclasses import dataclass
from typing import Any

from kvscope.connector.common.tier_health import TierHealthConfig

DEFAULT_CPU_BYTES = 256 * 2**20


@dataclass(frozen=True)
class OffloadConfig:
    """Host pool size in vLLM's own keys: `cpu_bytes_to_use` is server-wide (split evenly over
    the world's ranks, as vLLM's SimpleCPUOffloadConnector does); `cpu_bytes_to_use_per_rank`,
    when given, is what each rank allocates."""

    cpu_bytes_to_use: int = DEFAULT_CPU_BYTES
    cpu_bytes_to_use_per_rank: int | None = None
    lease_timeout_s: float = 30.0  # a hit not loaded by then is released and reported
    load_timeout_s: float = 10.0  # a load not finished by then is reported failed
    # When loads keep failing or timing out, the pool is bypassed for a while (tier_health.py).
    tier_health: TierHealthConfig = TierHealthConfig()

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> "OffloadConfig":
        extra = extra or {}
        per_rank = extra.get("cpu_bytes_to_use_per_rank")
        config = cls(
            cpu_bytes_to_use=int(extra.get("cpu_bytes_to_use", DEFAULT_CPU_BYTES)),
            cpu_bytes_to_use_per_rank=None if per_rank is None else int(per_rank),
            lease_timeout_s=float(extra.get("lease_timeout_s", 30.0)),
            load_timeout_s=float(extra.get("load_timeout_s", 10.0)),
            tier_health=TierHealthConfig.from_extra_config(extra),
        )
        if config.cpu_bytes_to_use <= 0:
            raise ValueError(f"cpu_bytes_to_use must be positive, got {config.cpu_bytes_to_use}")
        if per_rank is not None and config.cpu_bytes_to_use_per_rank <= 0:
            raise ValueError(f"cpu_bytes_to_use_per_rank must be positive, got {per_rank}")
        if config.lease_timeout_s <= 0 or config.load_timeout_s <= 0:
            raise ValueError("lease_timeout_s and load_timeout_s must be positive")
        return config

    def bytes_per_rank(self, world_size: int, sharing_ranks: int = 1) -> int:
        """What one rank's host pool may take: both halves size the pool from this. Ranks that
        share one pool (TP ranks holding identical MLA KV, replicas.py) pool their shares."""
        sharing_ranks = max(1, sharing_ranks)
        if self.cpu_bytes_to_use_per_rank is not None:
            return self.cpu_bytes_to_use_per_rank * sharing_ranks
        return self.cpu_bytes_to_use // max(1, world_size // sharing_ranks)
