"""The kv_transfer_params a prefill server returns and a decode server gets: built, and checked.

Version 1 (one KV cache group): `remote_block_ids` is a flat list. Version 2 (vLLM's hybrid KV
cache manager, several groups): one list per group, as vLLM's NixlConnector sends them, each
the tail of its group's blocks that ends at block `remote_num_blocks - 1` (a sliding-window
group keeps only its window there; vLLM freed the blocks before it). Both carry
`remote_registration`: a decode side that sees it grow handshakes again before reading.
"""

from dataclasses import dataclass
from typing import Any, Final

PARAMS_VERSION: Final = 2
"""Version of the kv_transfer_params below for several KV cache groups."""
ONE_GROUP_VERSION: Final = 1
"""Version sent with one group (a flat block id list), which every kvscope decode side reads."""
MAX_REMOTE_BLOCKS: Final = 1 << 16
"""Bound on remote block ids accepted in one request's params (over all groups)."""
MAX_GROUPS: Final = 64
"""Bound on KV cache groups accepted in one request's params."""
_MAX_STR: Final = 256


@dataclass(frozen=True)
class RemotePrefill:
    """Where a request's prefilled KV lives on the prefill server, and until when."""

    engine_id: str
    request_id: str  # the prefill server's request id: named in the 'read done' notification
    host: str  # side channel
    port: int
    block_ids: tuple[tuple[int, ...], ...]  # per KV cache group, the tail of its blocks
    num_tokens: int  # tokens whose KV the prefill server computed
    block_size: int
    lease_deadline_unix_s: float  # the prefill server frees the blocks at this wall time
    num_blocks: int  # block indices of the prefilled sequence: every group's list ends there
    registration: int = 0  # grows when the prefill server registers its KV cache again

    def first_held(self, group: int) -> int:
        """The first block index whose block the prefill side holds in this group."""
        return self.num_blocks - len(self.block_ids[group])

    def remote_ids(self, group: int, start: int, end: int) -> tuple[int, ...]:
        """The prefill side's block ids of block indices [start, end) in one group."""
        first = self.first_held(group)
        if start < first or end > self.num_blocks:
            raise ValueError(
                f"KV cache group {group}: blocks {start}..{end - 1} are needed, the prefill side"
                f" holds {first}..{self.num_blocks - 1}"
            )
        return self.block_ids[group][start - first : end - first]

    def to_params(self) -> dict[str, Any]:
        """kv_transfer_params for the decode request (what the proxy forwards)."""
        one_group = len(self.block_ids) == 1 and len(self.block_ids[0]) == self.num_blocks
        block_ids = list(self.block_ids[0]) if one_group else [list(g) for g in self.block_ids]
        params = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "kvscope_p2p_version": ONE_GROUP_VERSION if one_group else PARAMS_VERSION,
            "remote_engine_id": self.engine_id,
            "remote_request_id": self.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "remote_block_ids": block_ids,
            "remote_num_tokens": self.num_tokens,
            "remote_block_size": self.block_size,
            "remote_lease_deadline_unix_s": self.lease_deadline_unix_s,
            "remote_registration": self.registration,
        }
        if not one_group:
            params["remote_num_blocks"] = self.num_blocks
        return params

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> "RemotePrefill":
        """Parse the decode request's params; ValueError says which field is bad."""
        version = params.get("kvscope_p2p_version")
        if version == ONE_GROUP_VERSION:
            block_ids = (_block_list(params.get("remote_block_ids"), "remote_block_ids"),)
            num_blocks = len(block_ids[0])
        elif version == PARAMS_VERSION:
            block_ids = _group_lists(params.get("remote_block_ids"))
            num_blocks = _int(params, "remote_num_blocks", 0, MAX_REMOTE_BLOCKS)
            if any(len(group) > num_blocks for group in block_ids):
                raise ValueError("a group of remote_block_ids is longer than remote_num_blocks")
        else:
            raise ValueError(
                f"kvscope_p2p_version {version!r} is neither {ONE_GROUP_VERSION} nor"
                f" {PARAMS_VERSION}: run the same kvscope version on prefill and decode"
            )
        return cls(
            engine_id=_str(params, "remote_engine_id"),
            request_id=_str(params, "remote_request_id"),
            host=_str(params, "remote_host"),
            port=_int(params, "remote_port", 1, 65535),
            block_ids=block_ids,
            num_tokens=_int(params, "remote_num_tokens", 0, 2**31),
            block_size=_int(params, "remote_block_size", 1, 2**16),
            lease_deadline_unix_s=_number(params, "remote_lease_deadline_unix_s"),
            num_blocks=num_blocks,
            registration=(
                _int(params, "remote_registration", 0, 2**31)
                if "remote_registration" in params
                else 0  # a kvscope prefill server that never re-registers
            ),
        )


def _group_lists(value: Any) -> tuple[tuple[int, ...], ...]:
    if not isinstance(value, list) or not 0 < len(value) <= MAX_GROUPS:
        raise ValueError(
            f"remote_block_ids must be a list of 1 to {MAX_GROUPS} lists, one per KV cache group"
        )
    groups = tuple(_block_list(group, f"remote_block_ids[{i}]") for i, group in enumerate(value))
    if sum(len(group) for group in groups) > MAX_REMOTE_BLOCKS:
        raise ValueError(f"remote_block_ids hold more than {MAX_REMOTE_BLOCKS} block ids")
    return groups


def _block_list(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > MAX_REMOTE_BLOCKS:
        raise ValueError(f"{key} must be a list of at most {MAX_REMOTE_BLOCKS} block ids")
    entry = f"{key} entries"
    return tuple(_int({entry: b}, entry, 0, 2**31) for b in value)


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
