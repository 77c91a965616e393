"""The kv_transfer_params a prefill server returns and a decode server gets: built, and checked."""

from dataclasses import dataclass
from typing import Any, Final

PARAMS_VERSION: Final = 1
"""Version of the kv_transfer_params below; a decode side refuses other versions."""
MAX_REMOTE_BLOCKS: Final = 1 << 16
"""Bound on remote block ids accepted in one request's params."""
_MAX_STR: Final = 256


@dataclass(frozen=True)
class RemotePrefill:
    """Where a request's prefilled KV lives on the prefill server, and until when."""

    engine_id: str
    request_id: str  # the prefill server's request id: named in the 'read done' notification
    host: str  # side channel
    port: int
    block_ids: tuple[int, ...]  # the prefill server's block ids, in token order
    num_tokens: int  # tokens whose KV the prefill server computed
    block_size: int
    lease_deadline_unix_s: float  # the prefill server frees the blocks at this wall time

    def to_params(self) -> dict[str, Any]:
        """kv_transfer_params for the decode request (what the proxy forwards)."""
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "kvscope_p2p_version": PARAMS_VERSION,
            "remote_engine_id": self.engine_id,
            "remote_request_id": self.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_block_ids": list(self.block_ids),
            "remote_num_tokens": self.num_tokens,
            "remote_block_size": self.block_size,
            "remote_lease_deadline_unix_s": self.lease_deadline_unix_s,
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "RemotePrefill":
        """Parse the decode request's params; ValueError says which field is bad."""
        if params.get("kvscope_p2p_version") != PARAMS_VERSION:
            raise ValueError(
                f"kvscope_p2p_version {params.get('kvscope_p2p_version')!r} is not"
                f" {PARAMS_VERSION}: run the same kvscope version on prefill and decode"
            )
        block_ids = params.get("remote_block_ids")
        if not isinstance(block_ids, list) or len(block_ids) > MAX_REMOTE_BLOCKS:
            raise ValueError("remote_block_ids must be a list of at most 65536 block ids")
        return cls(
            engine_id=_str(params, "remote_engine_id"),
            request_id=_str(params, "remote_request_id"),
            host=_str(params, "remote_host"),
            port=_int(params, "remote_port", 1, 65535),
            block_ids=tuple(_int({"id": b}, "id", 0, 2**31) for b in block_ids),
            num_tokens=_int(params, "remote_num_tokens", 0, 2**31),
            block_size=_int(params, "remote_block_size", 1, 2**16),
            lease_deadline_unix_s=_number(params, "remote_lease_deadline_unix_s"),
        )


def _str(params: dict[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value or len(value) > _MAX_STR:
        raise ValueError(f"{key} must be a non-empty string of at most {_MAX_STR} characters")
    return value


def _int(params: dict[str, Any], key: str, low: int, high: int) -> int:
    value = params.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{key} must be an integer in [{low}, {high}], got {value!r}"[:120])
    return value


def _number(params: dict[str, Any], key: str) -> float:
    value = params.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise ValueError(f"{key} must be a number, got {value!r}"[:120])
    return float(value)
