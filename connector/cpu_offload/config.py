"""The CPU offload connector's settings, from vLLM's kv_connector_extra_config."""

from dataclasses import dataclass
from typing import Any

DEFAULT_CPU_BYTES = 256 * 2**20


@dataclass(frozen=True)
class OffloadConfig:
    """cpu_bytes_to_use is vLLM's own key name for the host pool size."""

    cpu_bytes_to_use: int = DEFAULT_CPU_BYTES
    lease_timeout_s: float = 30.0  # a hit not loaded by then is released and reported
    load_timeout_s: float = 10.0  # a load not finished by then is reported failed

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> "OffloadConfig":
        extra = extra or {}
        config = cls(
            cpu_bytes_to_use=int(extra.get("cpu_bytes_to_use", DEFAULT_CPU_BYTES)),
            lease_timeout_s=float(extra.get("lease_timeout_s", 30.0)),
            load_timeout_s=float(extra.get("load_timeout_s", 10.0)),
        )
        if config.cpu_bytes_to_use <= 0:
            raise ValueError(f"cpu_bytes_to_use must be positive, got {config.cpu_bytes_to_use}")
        if config.lease_timeout_s <= 0 or config.load_timeout_s <= 0:
            raise ValueError("lease_timeout_s and load_timeout_s must be positive")
        return config
