"""The P2P connector's settings, from vLLM's kv_connector_extra_config (or the environment)."""

import os
from dataclasses import dataclass, field
from typing import Any

from kvscope.connector.common.tier_health import TierHealthConfig
from kvscope.connector.p2p.transport.side_channel import DEFAULT_HOST

DEFAULT_SIDE_CHANNEL_PORT = 5700
PORT_ENV = "KVSCOPE_P2P_SIDE_CHANNEL_PORT"
HOST_ENV = "KVSCOPE_P2P_SIDE_CHANNEL_HOST"


@dataclass(frozen=True)
class P2PConfig:
    """Where the prefill side serves its handshake, and how long everything may take.

    lease_timeout_s: the prefill side frees a finished request's blocks this long after it
    finished unless the decode side read them first. lease_margin_s: the decode side neither
    starts nor accepts a read closer than this to the lease deadline (it covers clock skew
    between hosts and the poll delay), so a read can never see blocks the prefill side freed.
    """

    side_channel_host: str = DEFAULT_HOST
    side_channel_port: int = DEFAULT_SIDE_CHANNEL_PORT
    lease_timeout_s: float = 30.0
    lease_margin_s: float = 1.0
    read_timeout_s: float = 10.0
    handshake_timeout_s: float = 5.0
    tier_health: TierHealthConfig = field(default_factory=TierHealthConfig)  # per peer

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> "P2PConfig":
        extra = extra or {}
        config = cls(
            side_channel_host=str(
                extra.get("side_channel_host") or os.environ.get(HOST_ENV, DEFAULT_HOST)
            ),
            side_channel_port=int(
                extra.get("side_channel_port")
                or os.environ.get(PORT_ENV, DEFAULT_SIDE_CHANNEL_PORT)
            ),
            lease_timeout_s=float(extra.get("lease_timeout_s", 30.0)),
            lease_margin_s=float(extra.get("lease_margin_s", 1.0)),
            read_timeout_s=float(extra.get("read_timeout_s", 10.0)),
            handshake_timeout_s=float(extra.get("handshake_timeout_s", 5.0)),
            tier_health=TierHealthConfig.from_extra_config(extra),
        )
        config.check()
        return config

    def side_channel_port_of(self, tp_rank: int) -> int:
        """Tensor-parallel rank r serves (and asks a peer) on side_channel_port + r, as vLLM's
        NixlConnector does: each rank's KV lives in its own process."""
        return self.side_channel_port + tp_rank

    def check(self) -> None:
        if not 0 < self.side_channel_port < 65536:
            raise ValueError(f"side_channel_port must be in 1..65535, got {self.side_channel_port}")
        for name in ("lease_timeout_s", "read_timeout_s", "handshake_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.lease_margin_s < self.lease_timeout_s:
            raise ValueError(
                f"lease_margin_s ({self.lease_margin_s}) must be in [0, lease_timeout_s"
                f" ({self.lease_timeout_s})): raise lease_timeout_s"
            )
