"""What the P2P scheduler half tells its workers each step, and what workers report back."""

from dataclasses import dataclass, field
from typing import Final

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvscope.connector.p2p.params import RemotePrefill

P2P_METADATA_VERSION: Final = 2
NOTIF_PREFIX: Final = b"kvscope.p2p/1 done "
"""A decode side's 'I read (or no longer need) your blocks of request X' notification."""


def done_notif(remote_request_id: str) -> bytes:
    return NOTIF_PREFIX + remote_request_id.encode()


def req_id_of_notif(message: bytes) -> str | None:
    """The prefill request id a notification names, or None if it is not ours."""
    if not message.startswith(NOTIF_PREFIX):
        return None
    return message[len(NOTIF_PREFIX) :].decode(errors="replace")


@dataclass(frozen=True)
class BlockPull:
    """Decode side: read these remote blocks into these local blocks, pairwise, per KV cache
    group (a sliding-window group names only the blocks inside its window)."""

    req_id: str
    local_block_ids: tuple[tuple[int, ...], ...]
    remote_block_ids: tuple[tuple[int, ...], ...]
    remote: RemotePrefill

    @property
    def flat_local(self) -> list[int]:
        return [block_id for group in self.local_block_ids for block_id in group]

    @property
    def flat_remote(self) -> list[int]:
        return [block_id for group in self.remote_block_ids for block_id in group]

    @property
    def group_of_blocks(self) -> list[int]:
        """The KV cache group of each block of flat_local, pairwise."""
        return [g for g, group in enumerate(self.local_block_ids) for _ in group]


@dataclass(frozen=True)
class BlockRelease:
    """Decode side: tell the prefill side to free a request's blocks without reading them."""

    req_id: str
    remote: RemotePrefill


@dataclass(frozen=True)
class HeldBlocks:
    """Prefill side: blocks kept for a remote reader until it notifies or the lease ends."""

    req_id: str
    block_ids: tuple[tuple[int, ...], ...]  # per KV cache group
    lease_deadline_unix_s: float
    registration: int = 0  # what the lease's params name (P2PScheduler.registration)

    @property
    def num_blocks(self) -> int:
        return sum(len(group) for group in self.block_ids)


@dataclass
class P2PMetadata(KVConnectorMetadata):
    """One step's plan for the worker."""

    reqs_to_recv: list[BlockPull] = field(default_factory=list)
    reqs_to_release: list[BlockRelease] = field(default_factory=list)
    reqs_to_send: list[HeldBlocks] = field(default_factory=list)
    registration: int = 0  # what the scheduler's leases name now (P2PScheduler.registration)
    version: int = P2P_METADATA_VERSION


@dataclass
class P2PWorkerMeta(KVConnectorWorkerMetadata):
    """Why requests ended: finished_sending alone does not say whether the lease expired."""

    leases_expired: set[str] = field(default_factory=set)  # prefill request ids
    loads_failed: dict[str, str] = field(default_factory=dict)  # decode request id -> cause
    registration: int = 0  # the rank's: leases naming an older one were revoked

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, P2PWorkerMeta)
        return P2PWorkerMeta(
            self.leases_expired | other.leases_expired,
            {**self.loads_failed, **other.loads_failed},
            max(self.registration, other.registration),
        )
