"""One load of a shared prefix serves every request that asks for it while it is in flight.

Without this, N requests arriving together with one prefix in the host pool each lease and load
it, queued one behind another on the copy thread (convoys.py). A request whose next block is
being loaded for another request is told "not yet" (None: vLLM asks again next step). When the
load ends vLLM caches its blocks in its own prefix cache before it schedules the waiting
requests (it drains requests holding KV first), so they find the prefix there: one copy for
all, and they resume in the same step as the request that loaded it. Their wait is a
load_convoy point whose span lasts it, as a queued copy's is.
"""

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from kvscope.connector.cpu_offload.convoy_events import convoy_recorded
from kvscope.connector.cpu_offload.convoys import LoadConvoy

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.request import Request

    from kvscope.connector.cpu_offload.leases import Lease
    from kvscope.connector.cpu_offload.scheduler import OffloadScheduler

EXTRA_CONFIG_KEY: Final = "share_loads"
"""kv_connector_extra_config key: false gives every request a load of its own (the bench's
convoy arm)."""
MAX_WAITING: Final = 4096
"""Requests followed while they wait; one aborted while waiting is never asked again."""


class SharedLoads:
    """Holds a request back while another request's load of its next block is in flight."""

    def __init__(self, scheduler: "OffloadScheduler", enabled: bool = True) -> None:
        self.scheduler = scheduler
        # Several KV cache groups (hybrid models) hit per group: left to their own loads.
        self.enabled = enabled and not scheduler.groups.multi
        self._waiting: dict[str, _Waiting] = {}

    @classmethod
    def of(cls, scheduler: "OffloadScheduler", vllm_config: "VllmConfig") -> "SharedLoads":
        """On unless kv_connector_extra_config says share_loads: false, or vLLM's prefix cache
        is off (the waiting requests would find nothing there, and load after the first)."""
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        enabled = bool(extra.get(EXTRA_CONFIG_KEY, True))
        return cls(scheduler, enabled and bool(vllm_config.cache_config.enable_prefix_caching))

    def lookup(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        """The scheduler half's lookup, or (None, False) while another request loads the
        request's next block."""
        req_id = str(request.request_id)
        # A request that may not read cached KV (prompt logprobs) would not find it either.
        shares = self.enabled and not getattr(request, "skip_reading_prefix_cache", False)
        if shares and (leader := self._leader(request, num_computed_tokens)) is not None:
            if req_id not in self._waiting:
                if len(self._waiting) >= MAX_WAITING:  # the oldest was likely aborted
                    self._waiting.pop(next(iter(self._waiting)))
                wanted = self._keys(request, num_computed_tokens // self.scheduler.block_size)
                shared = len(set(wanted) & set(leader.block_keys))
                self._waiting[req_id] = _Waiting(leader.req_id, shared, time.monotonic())
            return None, False
        if (waited := self._waiting.pop(req_id, None)) is not None:
            waited_for = LoadConvoy(req_id, waited.leader, 1, waited.shared_blocks, waited.since)
            convoy_recorded(waited_for.ended(time.monotonic()))
        return self.scheduler.lookup(request, num_computed_tokens)

    def _leader(self, request: "Request", num_computed_tokens: int) -> "Lease | None":
        """The lease of another request's load in flight that reads the block this request's
        lookup would ask for first."""
        req_id = str(request.request_id)
        leases = [
            state.lease or state.expired_lease
            for other_id, state in self.scheduler.requests.items()
            if state.loading and other_id != req_id and (state.lease or state.expired_lease)
        ]
        if not leases:  # the usual case: no load in flight, nothing to hash
            return None
        start = num_computed_tokens // self.scheduler.block_size
        first = self._keys(request, start, start + 1)
        return next((lease for lease in leases if first and first[0] in lease.block_keys), None)

    def _keys(self, request: "Request", start: int, end: int | None = None) -> list[bytes]:
        """Pool keys of the request's blocks [start, end); to the last block a lookup may ask
        for (never the last prompt token's) when end is None."""
        last = (request.num_prompt_tokens - 1) // self.scheduler.block_size
        end = last if end is None else min(end, last)
        return self.scheduler.namespace.block_keys(request.block_hashes[start:end])


@dataclass(frozen=True)
class _Waiting:
    leader: str
    shared_blocks: int
    since: float  # time.monotonic() of the first lookup held back
