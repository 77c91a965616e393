"""Scheduler half of the CPU offload connector: lookups with leases, load and store planning."""

import time
from typing import TYPE_CHECKING

from kvscope.connector.common.rank_tally import RankTally
from kvscope.connector.common.tier_health import TierHealth, failure_reason
from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.faults import FaultInjector
from kvscope.connector.cpu_offload.groups import KVGroups
from kvscope.connector.cpu_offload.hit_leases import HitLeases
from kvscope.connector.cpu_offload.hits import GroupBlock, plan_hit, request_blocks
from kvscope.connector.cpu_offload.host_pool import BlockState, HostBlockPool, KVNamespace
from kvscope.connector.cpu_offload.kv_events import HostTierEvents
from kvscope.connector.cpu_offload.leases import LeaseTable
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadMetadata, OffloadWorkerMeta
from kvscope.connector.cpu_offload.request_state import LoadPhase, RequestState
from kvscope.connector.cpu_offload.span_attributes import (
    content_hashes,
    looked_up,
    lookup_skipped,
    recording,
)
from kvscope.connector.cpu_offload.stats import PoolGauges, Samples, SchedulerCounters
from kvscope.connector.cpu_offload.stores import StorePlanner, block_ids_by_group
from kvscope.traces.outcomes import RECOMPUTED

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

__all__ = ["LoadPhase", "OffloadScheduler", "RequestState"]


class OffloadScheduler:
    """Looks blocks up in the host pool, leases hits, and plans loads and stores per step.

    Never touches tensors: it owns the host pool's index (which host block holds which block key)
    and tells the workers, through OffloadMetadata, which blocks to copy where.
    """

    def __init__(
        self,
        config: OffloadConfig,
        namespace: KVNamespace,
        block_size: int,
        num_host_blocks: int,
        world_size: int,
        faults: FaultInjector,
        kv_events: bool = False,
        groups: KVGroups | None = None,
    ) -> None:
        self.config = config
        self.groups = groups or KVGroups()
        self.namespace = namespace
        self.block_size = block_size
        self.pool = HostBlockPool(num_host_blocks)
        self.faults = faults
        self.requests: dict[str, RequestState] = {}
        # Every rank copies its own shard of each block: a copy ends when all of them did.
        self.store_reports: RankTally[int] = RankTally(world_size)
        self.load_reports: RankTally[str] = RankTally(world_size)
        self._loads_to_send: list[BlockTransfer] = []
        self._to_flush: set[str] = set()
        self.stats = SchedulerCounters()
        self.samples = Samples()  # histogram samples and failures for the next stats report
        self.failure_outcome = RECOMPUTED  # what a failed load becomes; the core says
        self.kv_events = HostTierEvents(kv_events, block_size)
        self.stores = StorePlanner(
            self.pool, self.groups, namespace, block_size, self.kv_events, self.samples, self.stats
        )
        # Fed by every load's outcome (once all ranks reported); lookups ask it first.
        self.health = TierHealth("cpu_offload", config.tier_health)
        self.hit_leases = HitLeases(
            self.pool, config.lease_timeout_s, faults, self.health, self.samples
        )
        self.leases: LeaseTable = self.hit_leases.table
        self.pool_gauges = PoolGauges(self.pool)

    # --- lookups --------------------------------------------------------------------------

    def lookup(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        """Longest run of the prompt's blocks in the pool after the local hit, leased.

        Asking again with the same local hit gives the same answer and only extends the
        lease: vLLM may ask several times before it can allocate the request's blocks.
        """
        req_id = str(request.request_id)
        state = self.requests.setdefault(req_id, RequestState(request))
        if state.phase is not LoadPhase.LOOKUP:  # asked again after our load: nothing to offer
            return 0, False
        if (repeat := self._repeat_answer(state, num_computed_tokens)) is not None:
            return repeat
        self.hit_leases.release(state, outcome="superseded")
        start = num_computed_tokens // self.block_size
        # Never the last prompt token: vLLM must compute at least one token itself.
        end = (request.num_prompt_tokens - 1) // self.block_size
        state.load_start_block = start
        state.next_block_to_store = max(state.next_block_to_store, start)
        self.stats.lookups += 1
        if end <= start:
            return 0, False
        if not self.health.admit(req_id):  # a sick pool: recompute now, not after a timeout
            lookup_skipped("tier_bypassed")
            return 0, False
        hit = self._plan_hit(request, start, end)
        lease = self.hit_leases.take(req_id, hit)
        if recording():
            self._looked_up(request, hit, len(lease.host_block_ids) if lease else 0, start, end)
        # The pool leases the committed prefix of what it was asked (all of a multi-group plan).
        hit = hit[: len(lease.host_block_ids)] if lease else ()
        hit_end = max(b.index for b in hit) + 1 if hit else start
        num_tokens = (hit_end - start) * self.block_size
        self.stats.miss_tokens += (end - start) * self.block_size - num_tokens
        if lease is None:
            self.health.cancel(req_id)  # nothing to load: no outcome will come
            return 0, False
        state.lease, state.asked_at, state.hit = lease, num_computed_tokens, hit
        state.hit_end = hit_end
        self.hit_leases.acquired(state)
        self.stats.hit_tokens += num_tokens
        return num_tokens, True

    def _looked_up(
        self, request: "Request", asked: tuple[GroupBlock, ...], leased: int, start: int, end: int
    ) -> None:
        """The lookup's event: what it asked, each block's content, and whether the first
        block it missed was being written (a store still copying it) or absent."""
        first_miss_state = None
        if leased < len(asked):
            state = self.pool.state_of(asked[leased].key)
            first_miss_state = "writing" if state is BlockState.RESERVED else "absent"
        contents = content_hashes(request.prompt_token_ids or (), self.block_size, start, end)
        if len(asked) != len(contents):  # a multi-group plan: its blocks are not one per index
            contents = []
        looked_up(
            [b.key for b in asked],
            self.block_size,
            self.pool.num_blocks,
            contents,
            first_miss_state,
        )

    def _plan_hit(self, request: "Request", start: int, end: int) -> tuple[GroupBlock, ...]:
        """The blocks of every group to lease for the longest hit of blocks [start, end)."""
        by_group = request_blocks(self.groups, self.namespace, request.block_hashes, start, end)
        if not self.groups.multi:  # one full-attention group: the pool's own prefix lookup
            return tuple(by_group[self.groups.groups[0].group_id])
        return tuple(plan_hit(self.pool, self.groups, by_group, start))

    def _repeat_answer(
        self, state: RequestState, num_computed_tokens: int
    ) -> tuple[int, bool] | None:
        """The held lease's answer when the question is the one it answered, else None."""
        if state.lease is None or state.asked_at != num_computed_tokens:
            return None
        if not self.hit_leases.refresh(state):  # it expired meanwhile
            return None
        return (state.hit_end - state.load_start_block) * self.block_size, True

    def bind(
        self,
        request: "Request",
        block_ids: tuple[list[int], ...] | list[int],
        num_external_tokens: int,
    ) -> None:
        """update_state_after_alloc: the destination blocks of a hit; releases a declined hit.

        block_ids: vLLM's block ids per KV cache group (one list of ints for one group)."""
        state = self.requests.get(str(request.request_id))
        if state is None or state.lease is None or state.loading:
            return
        if num_external_tokens <= 0:  # e.g. a MultiConnector chose another child
            self.hit_leases.release(state, outcome="declined")
            return
        transfer = state.load_transfer(
            block_ids_by_group(block_ids), num_external_tokens, self.block_size, self.groups.multi
        )
        self._loads_to_send.append(transfer)
        state.phase, state.load_started_at = LoadPhase.LOADING, time.monotonic()
        state.next_block_to_store = max(state.next_block_to_store, state.hit_end)

    # --- per step -------------------------------------------------------------------------

    def build_metadata(
        self, scheduler_output: "SchedulerOutput", kv_cache_manager: "KVCacheManager"
    ) -> OffloadMetadata:
        self.hit_leases.expire(self.requests)
        stores = [
            store
            for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items()
            if (store := self._plan_store(req_id, num_tokens, kv_cache_manager)) is not None
        ]
        metadata = OffloadMetadata(
            self._loads_to_send,
            stores,
            self._to_flush,
            self.stores.unheld_of(set(scheduler_output.preempted_req_ids or ())),
            self.pool.num_blocks,
        )
        self._loads_to_send, self._to_flush = [], set()
        return metadata

    def _plan_store(
        self, req_id: str, num_tokens: int, kv_cache_manager: "KVCacheManager"
    ) -> BlockTransfer | None:
        state = self.requests.get(req_id)
        if state is None or state.loading:
            return None
        store = self.stores.plan(state, num_tokens, kv_cache_manager)
        if store is not None:
            state.stores_in_flight.add(store.transfer_id)
        return store

    # --- worker reports -------------------------------------------------------------------

    def on_worker_output(self, worker_meta: "KVConnectorWorkerMetadata | None") -> None:
        """One step's copy reports, summed over ranks; a copy ends once every rank reported."""
        if not isinstance(worker_meta, OffloadWorkerMeta):
            return
        for store_id, ok in self.store_reports.add(
            worker_meta.stores_done, worker_meta.stores_failed
        ):
            self._end_store(store_id, committed=ok)
        for req_id, ok in self.load_reports.add(worker_meta.loads_done, worker_meta.loads_failed):
            self._end_load(req_id, failed=not ok)

    def _end_store(self, store_id: int, committed: bool) -> None:
        store = self.stores.end(store_id, committed)
        state = self.requests.get(store.req_id) if store is not None else None
        if state is not None:
            state.stores_in_flight.discard(store_id)
            self._forget_if_done(store.req_id, state)

    def _end_load(self, req_id: str, failed: bool) -> None:
        state = self.requests.get(req_id)
        if state is None or not state.loading:
            return
        lease, waited_s = state.lease, time.monotonic() - state.load_started_at
        state.phase = LoadPhase.RECOMPUTE if failed else LoadPhase.LOOKUP
        self.samples.observe("kv_wait_seconds", waited_s)
        self.health.record(req_id, not failed, failure_reason(waited_s, self.config.load_timeout_s))
        if failed:
            self.samples.fail("load_failed", self.failure_outcome)
        if lease is not None:
            if failed:
                self.stats.failed_loads += 1
                self.stats.failed_load_blocks += len(lease.host_block_ids)
            else:
                self.stats.loaded_blocks += len(lease.host_block_ids)
            self.hit_leases.release(state, outcome="failed" if failed else "released")
        if state.expired_lease is not None:
            self.pool.unpin(list(state.expired_lease.host_block_ids))
            state.expired_lease = None
        self._forget_if_done(req_id, state)

    # --- request end ----------------------------------------------------------------------

    def finished(self, request: "Request") -> bool:
        """Releases the request's lease; True when the workers will report it in
        finished_sending because stores still read its blocks.

        A request that ends while its load runs is freed by vLLM itself on finished_recving;
        saying True then too would have vLLM free it twice. Its stores in flight from before a
        preemption hold their blocks (a vLLM block reference each) until they end.
        """
        req_id = str(request.request_id)
        state = self.requests.get(req_id)
        if state is None:
            return False
        state.ended = True
        if not state.loading:
            self.hit_leases.release(state, outcome="aborted")
        delay_free = bool(state.stores_in_flight) and not state.loading
        if delay_free:
            self._to_flush.add(req_id)
        self._forget_if_done(req_id, state)
        return delay_free

    def _forget_if_done(self, req_id: str, state: RequestState) -> None:
        if state.ended and not state.stores_in_flight and not state.loading:
            self.requests.pop(req_id, None)

    def reset_cache(self) -> bool:
        """vLLM's connector cache reset (a weight update, sleep mode's pause): forgets every
        block, so no KV computed before it is loaded after it. Stores still copying are not
        committed. False, as vLLM's own prefix cache answers, while loads still read blocks."""
        for state in self.requests.values():
            if not state.loading:
                self.hit_leases.release(state, outcome="reset")
        self.stores.drop_all()
        self.kv_events.removed(self.pool.evict_committed())
        return not any(state.loading for state in self.requests.values())

    def report_values(self) -> tuple[dict[str, int], dict[str, int]]:
        """Cumulative counters and gauges for the connector's stats. The pool's part walks
        every host block, so it is refreshed at most once a second, not every step."""
        pool_gauges, evicted = self.pool_gauges.read()
        gauges = {
            **pool_gauges,
            "pending_stores": len(self.stores.in_flight),
            "active_leases": len(self.leases.active()),
            **self.health.gauges(),
        }
        counters = {"evicted_blocks": evicted, "lease_expiries": self.hit_leases.expiries}
        return {**self.stats.as_dict(), **counters, **self.health.counters()}, gauges

    def held(self) -> dict[str, object]:
        """What this half still holds, by kind; every value is falsy once it holds nothing
        (leak checks read this instead of the private fields)."""
        return {
            "active_leases": sorted(lease.lease_id for lease in self.leases.active()),
            "pinned_host_blocks": self.pool.stats().pinned,
            "tracked_requests": sorted(self.requests),
            "stores_in_flight": sorted(self.stores.in_flight),
            "expired_leases_in_flight": sorted(self.expired_leases_in_flight()),
            "stores_reported_by_some_ranks": sorted(self.store_reports.pending()),
            "loads_reported_by_some_ranks": sorted(self.load_reports.pending()),
        }

    def expired_leases_in_flight(self) -> list[str]:
        """Requests whose lease ran out during their load, blocks still pinned (leak checks)."""
        return [req_id for req_id, s in self.requests.items() if s.expired_lease is not None]
