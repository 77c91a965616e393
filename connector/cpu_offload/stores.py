"""Store planning of the offload scheduler half: which blocks of which group go to the host."""

import itertools
from dataclasses import replace
from typing import TYPE_CHECKING

from kvscope.connector.cpu_offload.groups import KVGroups
from kvscope.connector.cpu_offload.hits import GroupBlock, interleave, request_blocks
from kvscope.connector.cpu_offload.host_pool import HostBlockPool, KVNamespace, Reservation
from kvscope.connector.cpu_offload.kv_events import HostTierEvents
from kvscope.connector.cpu_offload.metadata import BlockTransfer
from kvscope.connector.cpu_offload.request_state import PlannedStore, RequestState
from kvscope.connector.cpu_offload.span_attributes import blocks_attributes
from kvscope.connector.cpu_offload.stats import Samples, SchedulerCounters
from kvscope.traces import names
from kvscope.traces.facts import add_event

if TYPE_CHECKING:
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import KVCacheBlock
    from vllm.v1.request import Request


class StorePlanner:
    """Reserves host blocks for the blocks a step fills and ends the stores the workers
    reported; `in_flight` holds every store planned and not yet reported by all ranks. The
    scheduler half owns it and the requests' states, of which plan() moves the store cursor."""

    def __init__(
        self,
        pool: HostBlockPool,
        groups: KVGroups,
        namespace: KVNamespace,
        block_size: int,
        kv_events: HostTierEvents,
        samples: Samples,
        counters: SchedulerCounters,
    ) -> None:
        self.pool = pool
        self.groups = groups
        self.namespace = namespace
        self.block_size = block_size
        self.kv_events = kv_events
        self.samples = samples
        self.counters = counters
        self.in_flight: dict[int, PlannedStore] = {}
        self._ids = itertools.count(1)
        self._host_block_group: list[int] = [0] * pool.num_blocks  # for eviction events

    def plan(
        self, state: RequestState, num_tokens: int, kv_cache_manager: "KVCacheManager"
    ) -> BlockTransfer | None:
        """Reserves host blocks for the request's blocks, of every group, that this step
        fills, and moves its store cursor (state.next_block_to_store) past them."""
        request, req_id = state.request, str(state.request.request_id)
        full = min(
            (request.num_computed_tokens + num_tokens) // self.block_size, len(request.block_hashes)
        )
        first = state.next_block_to_store
        if full <= first:
            return None
        state.next_block_to_store = full
        ids_by_group = block_ids_by_group(kv_cache_manager.get_block_ids(req_id))
        block_pool = getattr(kv_cache_manager, "block_pool", None)
        blocks = [
            b
            for b in interleave(
                request_blocks(self.groups, self.namespace, request.block_hashes, first, full)
            )
            if _real_block(block_pool, ids_by_group[b.group_id], b.index)
        ]
        of_key = {b.key: b for b in blocks}
        reservation = self._reserve(request, of_key)
        if not reservation.host_block_ids:
            return None
        reserved = [of_key[key] for key in reservation.block_keys]
        device = tuple(ids_by_group[b.group_id][b.index] for b in reserved)
        store_id = next(self._ids)
        self.in_flight[store_id] = PlannedStore(
            req_id,
            list(reservation.host_block_ids),
            list(reservation.block_keys),
            [b.group_id for b in reserved],
            self._hold_device_blocks(block_pool, device),
            block_pool,
        )
        group_ids = tuple(b.group_id for b in reserved) if self.groups.multi else ()
        return BlockTransfer(req_id, device, tuple(reservation.host_block_ids), store_id, group_ids)

    def _reserve(self, request: "Request", of_key: dict[bytes, GroupBlock]) -> Reservation:
        """Host blocks for the blocks not in the pool yet; evictions reported with their group."""
        reservation = self.pool.reserve(list(of_key))
        self.kv_events.removed(reservation.evicted_keys)
        self.kv_events.planned(
            request, {k: (b.index, b.group_id) for k, b in of_key.items()}, reservation.block_keys
        )
        if reservation.evicted_keys:
            evicted = reservation.evicted_host_block_ids
            groups = [self._host_block_group[host_block_id] for host_block_id in evicted]
            add_event(
                names.EVENT_BLOCK_EVICTED,
                **blocks_attributes(evicted, reservation.evicted_keys, groups),
            )
        for key, host_block_id in zip(
            reservation.block_keys, reservation.host_block_ids, strict=True
        ):
            self._host_block_group[host_block_id] = of_key[key].group_id
        return reservation

    def _hold_device_blocks(
        self, block_pool: "BlockPool | None", device: tuple[int, ...]
    ) -> list["KVCacheBlock"]:
        """Takes a reference on every device block a store reads (vLLM's touch), released when
        every rank reported the store: vLLM cannot hand them to another request before the
        copy ends. A preemption frees a request's blocks to the next allocation of the same
        schedule, and model runner V2 zeroes and copies-on-write new blocks (update_requests)
        before any connector hook of that step; a sliding window frees its old blocks while
        the request runs. A wait in handle_preemptions would come too late for V2."""
        if block_pool is None:
            return []
        held = [block_pool.blocks[block_id] for block_id in device]
        block_pool.touch(held)
        return held

    def unheld_of(self, req_ids: set[str]) -> set[str]:
        """Those of these requests with a store in flight that holds no reference on its device
        blocks (no block pool was bound): the worker must wait for it before vLLM reuses them.
        A held store needs no wait (on CUDA the wait would drain the forward queued before)."""
        if not req_ids:
            return set()
        return {
            s.req_id for s in self.in_flight.values() if s.req_id in req_ids and not s.held_blocks
        }

    def end(self, store_id: int, committed: bool) -> PlannedStore | None:
        """Commits (or aborts) a store every rank reported; the store, None if unknown."""
        store = self.in_flight.pop(store_id, None)
        if store is None:
            return None
        committed = committed and not store.dropped
        (self.pool.commit if committed else self.pool.abort)(store.host_block_ids)
        (self.kv_events.committed if committed else self.kv_events.aborted)(store.keys)
        if store.held_blocks:
            store.block_pool.free_blocks(store.held_blocks)
        if not committed and not store.dropped:
            self.samples.fail("store_failed", "dropped")  # a later lookup misses them
        if committed:
            self.counters.stored_blocks += len(store.host_block_ids)
            add_event(
                names.EVENT_BLOCK_STORED,
                **{names.REQUEST_ID: store.req_id},
                **blocks_attributes(store.host_block_ids, store.keys, store.group_ids),
            )
        return store

    def drop_all(self) -> None:
        """The cache was reset: stores still copying are aborted, not committed, when they end."""
        self.in_flight = {i: replace(s, dropped=True) for i, s in self.in_flight.items()}


def block_ids_by_group(block_ids: tuple[list[int], ...] | list[int]) -> tuple[list[int], ...]:
    """vLLM's block ids per KV cache group; a bare list of ints is one group's."""
    if block_ids and isinstance(block_ids[0], int):
        return (list(block_ids),)
    return tuple(block_ids)


def _real_block(block_pool: "BlockPool | None", group_block_ids: list[int], index: int) -> bool:
    """Whether the request has a block there: a sliding-window group holds vLLM's null block in
    place of those that left the window (nothing to store)."""
    if index >= len(group_block_ids):
        return False
    return block_pool is None or not block_pool.blocks[group_block_ids[index]].is_null
