"""Leases the offload scheduler half holds on host blocks for hits: each change, its span event."""

from typing import Any, Final

from kvscope.connector.common.tier_health import TierHealth
from kvscope.connector.cpu_offload.faults import FaultInjector
from kvscope.connector.cpu_offload.hits import GroupBlock
from kvscope.connector.cpu_offload.host_pool import HostBlockPool
from kvscope.connector.cpu_offload.leases import Lease, LeaseTable
from kvscope.connector.cpu_offload.request_state import RequestState
from kvscope.connector.cpu_offload.span_attributes import lease_attributes
from kvscope.connector.cpu_offload.stats import Samples
from kvscope.traces import names
from kvscope.traces.facts import add_event
from kvscope.traces.outcomes import KEPT_PINNED, RELEASED

LOAD_OUTCOMES: Final = frozenset({"failed", "released"})
"""Release outcomes that end a load, whose result the tier's health already recorded."""


class HitLeases:
    """Takes, refreshes, releases and expires the leases on requests' hits (a LeaseTable)."""

    def __init__(
        self,
        pool: HostBlockPool,
        timeout_s: float,
        faults: FaultInjector,
        health: TierHealth,
        samples: Samples,
    ) -> None:
        self.pool = pool
        self.table = LeaseTable(pool, timeout_s)
        self.faults = faults
        self.health = health
        self.samples = samples
        self.expiries = 0  # leases that ran out, loading or not

    def take(self, req_id: str, hit: tuple[GroupBlock, ...]) -> Lease | None:
        """A lease on the committed prefix of the hit's blocks, or None."""
        if not hit:
            return None
        plan = self.faults.plan
        timeout_s = plan.lease_timeout_ms / 1000 if plan.lease_timeout_ms else None
        return self.table.lookup(req_id, [b.key for b in hit], timeout_s=timeout_s)

    def acquired(self, state: RequestState) -> None:
        """The request holds state.lease now: says so, and attacks it if the fault plan asks."""
        lease = state.lease
        add_event(names.EVENT_LEASE_ACQUIRED, **self.attributes(lease, state))
        if self.faults.plan.evict_leased:
            # The pool must refuse to evict blocks that are leased.
            refused = sum(not self.pool.evict(key) for key in lease.block_keys)
            add_event(
                names.EVENT_EVICTION_REFUSED,
                **{names.LEASE_ID: lease.lease_id, names.BLOCK_COUNT: refused},
            )

    def refresh(self, state: RequestState) -> bool:
        """Extends the request's lease; False when it expired meanwhile."""
        refreshed = self.table.refresh(state.lease.lease_id)
        if refreshed is None:
            return False
        state.lease = refreshed
        return True

    def release(self, state: RequestState, outcome: str) -> None:
        if state.lease is None:
            return
        attributes = self.attributes(state.lease, state)
        lease, state.lease = state.lease, None
        if outcome not in LOAD_OUTCOMES:  # no load outcome will come for it
            self.health.cancel(lease.req_id)
        if self.table.release(lease.lease_id) is not None:
            add_event(names.EVENT_LEASE_RELEASED, **attributes, **{names.LEASE_OUTCOME: outcome})

    def expire(self, requests: dict[str, RequestState]) -> None:
        """Leases past their time: a hit not loading yet is released (the next lookup leases
        again); one whose load copies from its blocks keeps them pinned until the load ends."""
        for lease in self.table.expire():
            state = requests.get(lease.req_id)
            loading = state is not None and state.loading
            outcome = KEPT_PINNED if loading else RELEASED
            add_event(
                names.EVENT_LEASE_EXPIRED,
                **self.attributes(lease, state),
                **{
                    names.LEASE_OUTCOME: "expired",
                    names.REQUEST_ID: lease.req_id,
                    names.FAILURE_CAUSE: "lease_expired" + (" during its load" if loading else ""),
                    names.FAILURE_OUTCOME: outcome,
                },
            )
            self.expiries += 1
            self.samples.fail("lease_expired_during_load" if loading else "lease_expired", outcome)
            if loading:
                self.pool.pin(list(lease.host_block_ids))
                state.expired_lease = lease
            elif state is not None:
                state.lease = None
                self.health.cancel(lease.req_id)

    def attributes(self, lease: Lease, state: RequestState | None) -> dict[str, Any]:
        hit = state.hit if state is not None and state.lease is not None else ()
        group_ids = [b.group_id for b in hit] if len(hit) == len(lease.host_block_ids) else []
        return lease_attributes(lease, self.table.timeout_s, group_ids)
