"""Leases: a hit pins its host blocks until the load finishes, the request ends or time runs out."""

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kvscope.connector.common.lease_ids import next_lease_id
from kvscope.connector.cpu_offload.host_pool import HostBlockPool


@dataclass(frozen=True)
class Lease:
    """Host blocks promised to one request's load; they cannot be evicted while it is held."""

    lease_id: int
    req_id: str
    host_block_ids: tuple[int, ...]
    block_keys: tuple[bytes, ...]
    created_at: float
    expires_at: float
    timeout_s: float = 30.0  # how long it lasts from its last refresh


@dataclass
class LeaseCounters:
    """Since start; eviction_refused comes from the pool, which is where evictions happen."""

    acquired: int = 0
    released: int = 0
    expired: int = 0
    eviction_refused: int = 0
    active: int = 0


@dataclass
class LeaseTable:
    """Active leases over one HostBlockPool, by lease id and by holder request."""

    pool: HostBlockPool
    timeout_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    _leases: dict[int, Lease] = field(default_factory=dict)
    _lease_ids_of_req: dict[str, set[int]] = field(default_factory=dict)
    _counters: LeaseCounters = field(default_factory=LeaseCounters)

    def lookup(
        self,
        req_id: str,
        block_keys: list[bytes],
        now: float | None = None,
        timeout_s: float | None = None,
    ) -> Lease | None:
        """Leases the longest committed prefix of block_keys; None when the first key misses."""
        host_block_ids = self.pool.lookup(block_keys)
        if not host_block_ids:
            return None
        return self.acquire(req_id, host_block_ids, now, timeout_s)

    def acquire(
        self,
        req_id: str,
        host_block_ids: list[int],
        now: float | None = None,
        timeout_s: float | None = None,
    ) -> Lease:
        """timeout_s overrides the table's timeout for this lease (fault injection)."""
        now = self.clock() if now is None else now
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        self.pool.pin(host_block_ids)
        lease = Lease(
            lease_id=next_lease_id(),
            req_id=req_id,
            host_block_ids=tuple(host_block_ids),
            block_keys=tuple(self.pool.key_of(b) for b in host_block_ids),
            created_at=now,
            expires_at=now + timeout_s,
            timeout_s=timeout_s,
        )
        self._leases[lease.lease_id] = lease
        self._lease_ids_of_req.setdefault(req_id, set()).add(lease.lease_id)
        self._counters.acquired += 1
        return lease

    def refresh(self, lease_id: int, now: float | None = None) -> Lease | None:
        """Restarts an active lease's clock (its holder asked again); None if it is gone."""
        lease = self._leases.get(lease_id)
        if lease is None:
            return None
        now = self.clock() if now is None else now
        lease = dataclasses.replace(lease, expires_at=max(lease.expires_at, now + lease.timeout_s))
        self._leases[lease_id] = lease
        return lease

    def release(self, lease_id: int) -> Lease | None:
        """Ends a lease (load done). Releasing twice is harmless: the second returns None."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            return None
        self._drop(lease)
        self._counters.released += 1
        return lease

    def release_holder(self, req_id: str) -> list[Lease]:
        """Ends every lease of a request that finished or was aborted."""
        lease_ids = sorted(self._lease_ids_of_req.get(req_id, ()))
        return [lease for lease in map(self.release, lease_ids) if lease is not None]

    def expire(self, now: float | None = None) -> list[Lease]:
        """Ends leases past their deadline; the caller reports each as a failed load."""
        now = self.clock() if now is None else now
        expired = [lease for lease in self._leases.values() if lease.expires_at <= now]
        for lease in expired:
            del self._leases[lease.lease_id]
            self._drop(lease)
        self._counters.expired += len(expired)
        return expired

    def get(self, lease_id: int) -> Lease | None:
        return self._leases.get(lease_id)

    def active(self) -> list[Lease]:
        return list(self._leases.values())

    def holders(self) -> list[str]:
        return list(self._lease_ids_of_req)

    def counters(self) -> LeaseCounters:
        return LeaseCounters(
            acquired=self._counters.acquired,
            released=self._counters.released,
            expired=self._counters.expired,
            eviction_refused=self.pool.eviction_refused,
            active=len(self._leases),
        )

    def _drop(self, lease: Lease) -> None:
        self.pool.unpin(list(lease.host_block_ids))
        lease_ids = self._lease_ids_of_req.get(lease.req_id)
        if lease_ids is not None:
            lease_ids.discard(lease.lease_id)
            if not lease_ids:
                del self._lease_ids_of_req[lease.req_id]
