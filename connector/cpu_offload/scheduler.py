"""Scheduler half of the CPU offload connector: lookups with leases, load and store planning.

Never touches tensors: it owns the host pool's index (which host block holds which block key)
and tells the workers, through OffloadMetadata, which blocks to copy where.
"""

import itertools
from dataclasses import dataclass, field
from typing import Any

from kvscope.connector.common.faults import FaultInjector
from kvscope.connector.common.host_pool import HostBlockPool, KVNamespace
from kvscope.connector.common.leases import Lease, LeaseTable
from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadMetadata, OffloadWorkerMeta
from kvscope.traces import names
from kvscope.traces.attributes import compact_hash
from kvscope.traces.events import add_event
from kvscope.traces.outcomes import KEPT_PINNED, RELEASED


@dataclass
class RequestState:
    """What the scheduler half tracks for one live request."""

    request: Any
    lease: Lease | None = None  # a hit waiting for its load, or loading
    load_start_block: int = 0
    loading: bool = False  # the load was sent to the workers
    load_failed: bool = False  # then vLLM recomputes: offering the hit again would loop
    next_block_to_store: int = 0
    stores_in_flight: set[int] = field(default_factory=set)
    finished: bool = False


class OffloadScheduler:
    """Looks blocks up in the host pool, leases hits, and plans loads and stores per step."""

    def __init__(
        self,
        config: OffloadConfig,
        namespace: KVNamespace,
        block_size: int,
        num_host_blocks: int,
        num_workers: int,
        faults: FaultInjector,
    ) -> None:
        self.config = config
        self.namespace = namespace
        self.block_size = block_size
        self.num_workers = num_workers
        self.pool = HostBlockPool(num_host_blocks)
        self.leases = LeaseTable(self.pool, config.lease_timeout_s)
        self.faults = faults
        self.requests: dict[str, RequestState] = {}
        self._loads_to_send: list[BlockTransfer] = []
        self._to_flush: set[str] = set()
        self._stores: dict[int, tuple[str, list[int]]] = {}  # id -> (req, host blocks)
        self._store_ids = itertools.count(1)
        self._expired_in_flight: dict[str, Lease] = {}
        self.stats: dict[str, int] = {"lookups": 0, "hit_tokens": 0, "stored_blocks": 0,
                                      "loaded_blocks": 0, "failed_loads": 0}  # fmt: skip

    # --- lookups --------------------------------------------------------------------------

    def lookup(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        """Longest run of the prompt's blocks in the pool after the local hit, leased."""
        req_id = str(request.request_id)
        state = self.requests.setdefault(req_id, RequestState(request))
        if state.loading or state.load_failed:  # asked again after our load: nothing to offer
            return 0, False
        self._release_lease(state, outcome="superseded")  # repeated asks keep one lease
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
        if lease is None:
            return 0, False
        state.lease = lease
        add_event(names.EVENT_LEASE_ACQUIRED, **self._lease_attributes(lease))
        if plan.evict_leased:
            self._attack_lease(lease)
        num_tokens = len(lease.host_block_ids) * self.block_size
        self.stats["hit_tokens"] += num_tokens
        return num_tokens, True

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
        state.loading = True
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
            self._loads_to_send, stores, self._to_flush, self.pool.num_blocks
        )
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
            if loading:
                # The workers still copy from these blocks: keep them pinned until they finish.
                self.pool.pin(list(lease.host_block_ids))
                self._expired_in_flight[lease.req_id] = lease
            elif state is not None:
                state.lease = None  # no load started: nothing failed, the next lookup leases again

    # --- worker reports -------------------------------------------------------------------

    def on_worker_output(self, worker_meta: Any, finished_recving: set[str]) -> None:
        failed_loads: set[str] = set()
        if isinstance(worker_meta, OffloadWorkerMeta):
            failed_loads = worker_meta.loads_failed
            for store_id, count in worker_meta.stores_done.items():
                if count >= self.num_workers and store_id not in worker_meta.stores_failed:
                    self._end_store(store_id, committed=True)
            for store_id in worker_meta.stores_failed:
                self._end_store(store_id, committed=False)
        for req_id in finished_recving:
            self._end_load(req_id, failed=req_id in failed_loads)

    def _end_store(self, store_id: int, committed: bool) -> None:
        req_id, host_block_ids, keys = self._stores.pop(store_id, (None, [], []))
        if req_id is None:
            return
        (self.pool.commit if committed else self.pool.abort)(host_block_ids)
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
        state.loading = False
        state.load_failed = failed
        if lease is not None:
            self.stats["loaded_blocks"] += len(lease.host_block_ids)
            self.stats["failed_loads"] += failed
            self._release_lease(state, outcome="failed" if failed else "released")
        if expired := self._expired_in_flight.pop(req_id, None):
            self.pool.unpin(list(expired.host_block_ids))
        self._forget_if_done(req_id, state)

    # --- request end ----------------------------------------------------------------------

    def finished(self, request: Any) -> bool:
        """Releases the request's lease; True while its stores still read its blocks."""
        req_id = str(request.request_id)
        state = self.requests.get(req_id)
        if state is None:
            return False
        state.finished = True
        if not state.loading:
            self._release_lease(state, outcome="aborted")
        # A load still writes into the request's blocks: vLLM frees them on finished_recving.
        # Stores still read them: the workers report finished_sending once they are done.
        delay_free = bool(state.stores_in_flight) or state.loading
        if state.stores_in_flight:
            self._to_flush.add(req_id)
        self._forget_if_done(req_id, state)
        return delay_free

    def _forget_if_done(self, req_id: str, state: RequestState) -> None:
        if state.finished and not state.stores_in_flight and not state.loading:
            self.requests.pop(req_id, None)

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
