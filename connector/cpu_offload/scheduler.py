"""Scheduler half of the CPU offload connector: lookups with leases, load and store planning.

Never touches tensors: it owns the host pool's index (which host block holds which block key)
and tells the workers, through OffloadMetadata, which blocks to copy where.
"""

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvscope.connector.common.faults import FaultInjector
from kvscope.connector.common.host_pool import HostBlockPool, KVNamespace
from kvscope.connector.common.leases import Lease, LeaseTable
from kvscope.connector.common.rank_tally import RankTally
from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.kv_events import HostTierEvents
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadMetadata, OffloadWorkerMeta
from kvscope.connector.cpu_offload.stats import Samples
from kvscope.traces import names
from kvscope.traces.attributes import compact_hash
from kvscope.traces.events import add_event
from kvscope.traces.outcomes import KEPT_PINNED, RECOMPUTED, RELEASED


class LoadPhase(Enum):
    """Where a request stands with the host pool's KV."""

    LOOKUP = "lookup"  # may be offered a hit (new, loaded, or back from preemption)
    LOADING = "loading"  # the workers are copying its hit into its blocks
    RECOMPUTE = "recompute"  # its load failed: vLLM recomputes, offering the hit again would loop


@dataclass
class RequestState:
    """What the scheduler half tracks for one live request."""

    request: Any
    phase: LoadPhase = LoadPhase.LOOKUP
    lease: Lease | None = None  # a hit waiting for its load, or loading
    asked_at: int = -1  # num_computed_tokens of the lookup that took the lease
    # A lease that ran out while its load copied from its blocks: pinned until the load ends.
    expired_lease: Lease | None = None
    load_start_block: int = 0
    load_started_at: float = 0.0  # time.monotonic() when its load was planned
    next_block_to_store: int = 0
    stores_in_flight: set[int] = field(default_factory=set)
    ended: bool = False  # vLLM called request_finished

    @property
    def loading(self) -> bool:
        return self.phase is LoadPhase.LOADING


class OffloadScheduler:
    """Looks blocks up in the host pool, leases hits, and plans loads and stores per step."""

    def __init__(
        self,
        config: OffloadConfig,
        namespace: KVNamespace,
        block_size: int,
        num_host_blocks: int,
        world_size: int,
        faults: FaultInjector,
        kv_events: bool = False,
    ) -> None:
        self.config = config
        self.namespace = namespace
        self.block_size = block_size
        self.pool = HostBlockPool(num_host_blocks)
        self.leases = LeaseTable(self.pool, config.lease_timeout_s)
        self.faults = faults
        self.requests: dict[str, RequestState] = {}
        # Every rank copies its own shard of each block: a copy ends when all of them did.
        self.store_reports: RankTally[int] = RankTally(world_size)
        self.load_reports: RankTally[str] = RankTally(world_size)
        self._loads_to_send: list[BlockTransfer] = []
        self._to_flush: set[str] = set()
        self._stores: dict[int, tuple[str, list[int], list[bytes]]] = {}  # id -> req, blocks
        self._store_ids = itertools.count(1)
        self.stats: dict[str, int] = {"lookups": 0, "hit_tokens": 0, "stored_blocks": 0,
                                      "loaded_blocks": 0, "failed_loads": 0,
                                      "failed_load_blocks": 0, "miss_tokens": 0,
                                      "lease_expiries": 0}  # fmt: skip
        self.samples = Samples()  # histogram samples and failures for the next stats report
        self.failure_outcome = RECOMPUTED  # what a failed load becomes; the core says
        self.kv_events = HostTierEvents(kv_events, block_size)
        self._pool_read_at, self._pool_gauges, self._evicted = float("-inf"), {}, 0

    # --- lookups --------------------------------------------------------------------------

    def lookup(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
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
        self._release_lease(state, outcome="superseded")
        start = num_computed_tokens // self.block_size
        # Never the last prompt token: vLLM must compute at least one token itself.
        end = (request.num_prompt_tokens - 1) // self.block_size
        hashes = request.block_hashes[start:end]
        state.load_start_block = start
        state.next_block_to_store = max(state.next_block_to_store, start)
        self.stats["lookups"] += 1
        if not hashes:
            return 0, False
        plan = self.faults.plan
        timeout_s = plan.lease_timeout_ms / 1000 if plan.lease_timeout_ms else None
        lease = self.leases.lookup(req_id, self.namespace.block_keys(hashes), timeout_s=timeout_s)
        num_tokens = len(lease.host_block_ids) * self.block_size if lease else 0
        self.stats["miss_tokens"] += len(hashes) * self.block_size - num_tokens
        if lease is None:
            return 0, False
        state.lease, state.asked_at = lease, num_computed_tokens
        add_event(names.EVENT_LEASE_ACQUIRED, **self._lease_attributes(lease))
        if plan.evict_leased:
            self._attack_lease(lease)
        self.stats["hit_tokens"] += num_tokens
        return num_tokens, True

    def _repeat_answer(self, state: RequestState, num_computed_tokens: int):
        """The held lease's answer when the question is the one it answered, else None."""
        lease = state.lease
        if lease is None or state.asked_at != num_computed_tokens:
            return None
        refreshed = self.leases.refresh(lease.lease_id)
        if refreshed is None:  # it expired meanwhile
            return None
        state.lease = refreshed
        return len(lease.host_block_ids) * self.block_size, True

    def _attack_lease(self, lease: Lease) -> None:
        """Fault injection: try to evict the blocks just leased; the pool must refuse."""
        refused = sum(not self.pool.evict(key) for key in lease.block_keys)
        add_event(names.EVENT_EVICTION_REFUSED, **{names.LEASE_ID: lease.lease_id,
                                                   names.BLOCK_COUNT: refused})  # fmt: skip

    def bind(self, request: Any, device_block_ids: list[int], num_external_tokens: int) -> None:
        """update_state_after_alloc: the destination blocks of a hit; releases a declined hit."""
        state = self.requests.get(str(request.request_id))
        if state is None or state.lease is None or state.loading:
            return
        if num_external_tokens <= 0:  # e.g. a MultiConnector chose another child
            self._release_lease(state, outcome="declined")
            return
        lease = state.lease
        count = num_external_tokens // self.block_size
        destination = device_block_ids[state.load_start_block : state.load_start_block + count]
        if count != len(lease.host_block_ids) or len(destination) != count:
            raise RuntimeError(
                f"request {request.request_id}: {num_external_tokens} external tokens do not "
                f"match the {len(lease.host_block_ids)} leased blocks"
            )
        state.phase, state.load_started_at = LoadPhase.LOADING, time.monotonic()
        state.next_block_to_store = max(state.next_block_to_store, state.load_start_block + count)
        self._loads_to_send.append(
            BlockTransfer(
                str(request.request_id), tuple(destination), lease.host_block_ids, lease.lease_id
            )  # fmt: skip
        )

    # --- per step -------------------------------------------------------------------------

    def build_metadata(self, scheduler_output: Any, kv_cache_manager: Any) -> OffloadMetadata:
        self._expire_leases()
        stores = [
            store
            for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items()
            if (store := self._plan_store(req_id, num_tokens, kv_cache_manager)) is not None
        ]
        metadata = OffloadMetadata(
            self._loads_to_send, stores, self._to_flush,
            set(scheduler_output.preempted_req_ids or ()), self.pool.num_blocks,
        )  # fmt: skip
        self._loads_to_send, self._to_flush = [], set()
        return metadata

    def _plan_store(self, req_id: str, num_tokens: int, kv_cache_manager: Any):
        """Reserves host blocks for the request's blocks that this step fills."""
        state = self.requests.get(req_id)
        if state is None or state.loading:
            return None
        request = state.request
        full = min((request.num_computed_tokens + num_tokens) // self.block_size,
                   len(request.block_hashes))  # fmt: skip
        first = state.next_block_to_store
        if full <= first:
            return None
        state.next_block_to_store = full
        keys = self.namespace.block_keys(request.block_hashes[first:full])
        reservation = self.pool.reserve(keys)
        self.kv_events.removed(reservation.evicted_keys)
        self.kv_events.planned(request, first, keys, reservation.block_keys)
        if reservation.evicted_keys:
            add_event(names.EVENT_BLOCK_EVICTED, **self._blocks_attributes(
                reservation.evicted_host_block_ids, reservation.evicted_keys))  # fmt: skip
        if not reservation.host_block_ids:
            return None
        device_ids = kv_cache_manager.get_block_ids(req_id)[0]
        position = {key: first + i for i, key in enumerate(keys)}
        device = tuple(device_ids[position[key]] for key in reservation.block_keys)
        store_id = next(self._store_ids)
        self._stores[store_id] = (req_id, list(reservation.host_block_ids),
                                  list(reservation.block_keys))  # fmt: skip
        state.stores_in_flight.add(store_id)
        return BlockTransfer(req_id, device, tuple(reservation.host_block_ids), store_id)

    def _expire_leases(self) -> None:
        for lease in self.leases.expire():
            state = self.requests.get(lease.req_id)
            loading = state is not None and state.loading
            add_event(names.EVENT_LEASE_EXPIRED, **self._lease_attributes(lease), **{
                names.LEASE_OUTCOME: "expired", names.REQUEST_ID: lease.req_id,
                names.FAILURE_CAUSE: "lease_expired" + (" during its load" if loading else ""),
                names.FAILURE_OUTCOME: KEPT_PINNED if loading else RELEASED})  # fmt: skip
            self.stats["lease_expiries"] += 1
            self.samples.fail("lease_expired_during_load" if loading else "lease_expired",
                              KEPT_PINNED if loading else RELEASED)  # fmt: skip
            if loading:
                # The workers still copy from these blocks: keep them pinned until they finish.
                self.pool.pin(list(lease.host_block_ids))
                state.expired_lease = lease
            elif state is not None:
                state.lease = None  # no load started: nothing failed, the next lookup leases again

    # --- worker reports -------------------------------------------------------------------

    def on_worker_output(self, worker_meta: Any) -> None:
        """One step's copy reports, summed over ranks; a copy ends once every rank reported."""
        if not isinstance(worker_meta, OffloadWorkerMeta):
            return
        for store_id, ok in self.store_reports.add(worker_meta.stores_done,
                                                   worker_meta.stores_failed):  # fmt: skip
            self._end_store(store_id, committed=ok)
        for req_id, ok in self.load_reports.add(worker_meta.loads_done, worker_meta.loads_failed):
            self._end_load(req_id, failed=not ok)

    def _end_store(self, store_id: int, committed: bool) -> None:
        req_id, host_block_ids, keys = self._stores.pop(store_id, (None, [], []))
        if req_id is None:
            return
        (self.pool.commit if committed else self.pool.abort)(host_block_ids)
        (self.kv_events.committed if committed else self.kv_events.aborted)(keys)
        if not committed:
            self.samples.fail("store_failed", "dropped")  # a later lookup misses them
        if committed:
            self.stats["stored_blocks"] += len(host_block_ids)
            add_event(names.EVENT_BLOCK_STORED, **{names.REQUEST_ID: req_id},
                      **self._blocks_attributes(host_block_ids, keys))  # fmt: skip
        state = self.requests.get(req_id)
        if state is not None:
            state.stores_in_flight.discard(store_id)
            self._forget_if_done(req_id, state)

    def _end_load(self, req_id: str, failed: bool) -> None:
        state = self.requests.get(req_id)
        if state is None or not state.loading:
            return
        lease = state.lease
        state.phase = LoadPhase.RECOMPUTE if failed else LoadPhase.LOOKUP
        self.samples.observe("kv_wait_seconds", time.monotonic() - state.load_started_at)
        if failed:
            self.samples.fail("load_failed", self.failure_outcome)
        if lease is not None:
            blocks = "failed_load_blocks" if failed else "loaded_blocks"
            self.stats[blocks] += len(lease.host_block_ids)
            self.stats["failed_loads"] += failed
            self._release_lease(state, outcome="failed" if failed else "released")
        if state.expired_lease is not None:
            self.pool.unpin(list(state.expired_lease.host_block_ids))
            state.expired_lease = None
        self._forget_if_done(req_id, state)

    # --- request end ----------------------------------------------------------------------

    def finished(self, request: Any) -> bool:
        """Releases the request's lease; True when the workers will report it in
        finished_sending because stores still read its blocks.

        A request that ends while its load runs is freed by vLLM itself on finished_recving;
        saying True then too would have vLLM free it twice. Its stores in flight read blocks
        from before a preemption, which vLLM flushed (handle_preemptions) before reusing them.
        """
        req_id = str(request.request_id)
        state = self.requests.get(req_id)
        if state is None:
            return False
        state.ended = True
        if not state.loading:
            self._release_lease(state, outcome="aborted")
        delay_free = bool(state.stores_in_flight) and not state.loading
        if delay_free:
            self._to_flush.add(req_id)
        self._forget_if_done(req_id, state)
        return delay_free

    def _forget_if_done(self, req_id: str, state: RequestState) -> None:
        if state.ended and not state.stores_in_flight and not state.loading:
            self.requests.pop(req_id, None)

    def report_values(self) -> tuple[dict[str, int], dict[str, int]]:
        """Cumulative counters and gauges for the connector's stats. The pool's part walks
        every host block, so it is refreshed at most once a second, not every step."""
        if time.monotonic() - self._pool_read_at >= 1.0:
            self._pool_read_at, pool = time.monotonic(), self.pool.stats()
            self._pool_gauges = {"host_blocks": pool.num_blocks,
                                 "host_blocks_used": pool.reserved + pool.committed,
                                 "host_blocks_pinned": pool.pinned}  # fmt: skip
            self._evicted = pool.evicted_blocks
        gauges = {**self._pool_gauges, "pending_stores": len(self._stores),
                  "active_leases": len(self.leases.active())}  # fmt: skip
        return {**self.stats, "evicted_blocks": self._evicted}, gauges

    def expired_leases_in_flight(self) -> list[str]:
        """Requests whose lease ran out during their load, blocks still pinned (leak checks)."""
        return [req_id for req_id, s in self.requests.items() if s.expired_lease is not None]

    def _release_lease(self, state: RequestState, outcome: str) -> None:
        if state.lease is None:
            return
        lease, state.lease = state.lease, None
        if self.leases.release(lease.lease_id) is not None:
            add_event(names.EVENT_LEASE_RELEASED, **self._lease_attributes(lease),
                      **{names.LEASE_OUTCOME: outcome})  # fmt: skip

    @staticmethod
    def _blocks_attributes(host_block_ids: list[int], keys: list[bytes]) -> dict[str, Any]:
        return {
            names.HOST_BLOCK_IDS: list(host_block_ids),
            names.BLOCK_HASHES: [compact_hash(key) for key in keys],
            names.BLOCK_COUNT: len(host_block_ids),
            names.BLOCK_TIER: "host",
        }

    def _lease_attributes(self, lease: Lease) -> dict[str, Any]:
        return {
            names.LEASE_TIMEOUT_S: self.leases.timeout_s,
            names.LEASE_ID: lease.lease_id,
            names.LEASE_HOLDER: lease.req_id,
            names.HOST_BLOCK_IDS: list(lease.host_block_ids),
            names.BLOCK_HASHES: [compact_hash(key) for key in lease.block_keys],
            names.BLOCK_COUNT: len(lease.host_block_ids),
        }
