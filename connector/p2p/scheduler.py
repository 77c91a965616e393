"""Scheduler half of the P2P connector: which blocks to keep for a reader, which to pull.

Never touches tensors. Prefill side: a finished request with do_remote_decode keeps its blocks
under a lease and returns the kv_transfer_params the decode side needs. Decode side: a request
with do_remote_prefill reports its prompt (less local hits, never the last token) as an
asynchronous external hit, and the worker pulls the blocks once vLLM has bound them.
"""

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvscope.connector.common.lease_ids import next_lease_id
from kvscope.connector.common.stats_schema import Samples
from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.groups import P2PGroups, held_tails, needed_ranges, pull_pairs
from kvscope.connector.p2p.metadata import (
    BlockPull,
    BlockRelease,
    HeldBlocks,
    P2PMetadata,
    P2PWorkerMeta,
)
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.connector.p2p.peer_health import PeerHealth
from kvscope.connector.p2p.stats import SchedulerCounters, failure_kind
from kvscope.connector.p2p.trace_spans import held_block_attributes
from kvscope.traces import names
from kvscope.traces.facts import add_event
from kvscope.traces.outcomes import RECOMPUTED

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

_FINISHED_OK = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")


class P2PScheduler:
    """Both halves of the protocol: an engine may prefill for some requests, decode for others."""

    def __init__(
        self, config: P2PConfig, engine_id: str, block_size: int, groups: P2PGroups | None = None
    ) -> None:
        self.config = config
        self.engine_id = engine_id
        self.block_size = block_size
        self.groups = groups or P2PGroups()
        self.null_block_id = 0  # vLLM's BlockPool makes block 0 its null block
        self.held_for_readers: dict[str, HeldBlocks] = {}  # prefill: req_id -> blocks kept
        self._lease_ids: dict[str, int] = {}
        self.lookups: dict[str, tuple[RemotePrefill, int]] = {}  # decode: (remote, computed)
        self.pulling: set[str] = set()  # decode: pulls handed to the worker, not finished
        self._to_send: list[HeldBlocks] = []
        self._to_recv: list[BlockPull] = []
        self._to_release: list[BlockRelease] = []
        # A breaker per prefill peer, fed by every pull's outcome; lookups ask it first.
        self.health = PeerHealth(config.tier_health, engine_id)
        # A refused lookup is computed here whatever the policy; inside a Multi (None) another
        # child may serve it, and the Multi says what it became.
        self.refusal_outcome: str | None = RECOMPUTED
        # What a failed pull became, for the stats (the worker's events say it too); None
        # inside a Multi.
        self.failure_outcome: str | None = RECOMPUTED
        self.stats = SchedulerCounters()
        self.samples = Samples()  # histogram samples and failures for the next stats report
        self._pull_started: dict[str, float] = {}  # decode request id -> monotonic start
        # Named in every lease's params; grows whenever the workers may have registered the KV
        # cache again, so that readers handshake again (see registration_may_change).
        self.registration = 0

    def registration_may_change(self) -> None:
        """vLLM reset the connector (a pause that cleared the cache, before sleep or a weight
        update) or sent handshake metadata again (after wake-up): the workers may register
        their KV cache again before the next lease, and readers must load it."""
        self.registration += 1

    # --- decode side ----------------------------------------------------------------------

    def lookup(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        """The prompt tokens to pull, less local hits and the last token; asynchronous."""
        params = request.kv_transfer_params
        req_id = str(request.request_id)
        if not params or not params.get("do_remote_prefill") or req_id in self.pulling:
            return 0, False
        try:
            remote = RemotePrefill.from_params(params)
        except ValueError as exc:
            return self._refuse(request, f"bad kv_transfer_params: {exc}", None, "bad_params")
        if remote.block_size != self.block_size:
            cause = (
                f"layout mismatch: prefill block_size {remote.block_size}, decode"
                f" {self.block_size}; start both engines with the same --block-size"
            )
            return self._refuse(request, cause, remote, "layout_mismatch")
        pullable = min(
            request.num_prompt_tokens - 1, remote.num_tokens, remote.num_blocks * self.block_size
        )
        if (cause := self._uncovered(remote, num_computed_tokens, pullable)) is not None:
            return self._refuse(request, cause, remote, "not_covered")
        if (cause := self._bypassed(remote, req_id)) is not None:
            return self._refuse(request, cause, remote)
        self.lookups[req_id] = (remote, num_computed_tokens)
        count = pullable - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def _bypassed(self, remote: RemotePrefill, req_id: str) -> str | None:
        """Why the peer is not asked now (its breaker is open), or None: a sick peer costs a
        recompute at once, not a handshake or read timeout per request."""
        sick = self.health.admit(remote.engine_id, req_id)
        if sick is None:
            return None
        return (
            f"peer bypassed: {sick.tier} {sick.state} after {sick.failures} failed pulls in a"
            f" row (bypass {sick.bypass_s:g} s); computing the prompt here"
        )

    def _uncovered(self, remote: RemotePrefill, num_computed: int, num_tokens: int) -> str | None:
        """Why the prefill side's blocks cannot serve this hit, or None."""
        if len(remote.block_ids) != len(self.groups.groups):
            return (
                f"KV cache groups differ: the prefill side sent {len(remote.block_ids)}, this"
                f" engine has {len(self.groups.groups)}; serve the same model on both, both"
                " with the hybrid KV cache manager or both with --disable-hybrid-kv-cache-manager"
            )
        if num_tokens <= num_computed:
            return None
        for group, needed in enumerate(
            needed_ranges(self.groups, num_computed, num_tokens, self.block_size)
        ):
            if needed and needed.start < remote.first_held(group):
                return (
                    f"KV cache group {group} needs blocks from {needed.start}, the prefill side"
                    f" holds them from {remote.first_held(group)} (its sliding window ended a"
                    " token later): computing the prompt here"
                )
        return None

    def _refuse(
        self, request: "Request", cause: str, remote: RemotePrefill | None, kind: str | None = None
    ) -> tuple[int, bool]:
        """No external hit (vLLM computes the prompt); the prefill side frees its blocks.
        A refusal of `kind` counts as a failure in the stats (a bypass does not: it has its own
        counter)."""
        logger.error("p2p: request %s: %s", request.request_id, cause)
        if kind is not None:
            self.samples.fail(kind, self.refusal_outcome or "left_to_parent")
        outcome = {names.FAILURE_OUTCOME: self.refusal_outcome} if self.refusal_outcome else {}
        add_event(
            names.EVENT_LOAD_FAILED,
            **{names.REQUEST_ID: str(request.request_id), names.FAILURE_CAUSE: cause},
            **outcome,
        )
        request.kv_transfer_params["do_remote_prefill"] = False
        if remote is not None:
            self._to_release.append(BlockRelease(str(request.request_id), remote))
        return 0, False

    def bind(
        self,
        request: "Request",
        block_ids: tuple[list[int], ...],
        num_external_tokens: int,
        local_null: Callable[[int, int], bool] | None = None,
    ) -> None:
        """update_state_after_alloc: pair the local blocks with the remote ones, once, per
        group; `local_null(group, index)` says where vLLM put its null block."""
        req_id = str(request.request_id)
        looked_up = self.lookups.pop(req_id, None)
        if looked_up is None:
            return
        remote, num_computed = looked_up
        request.kv_transfer_params["do_remote_prefill"] = False  # one transfer per request
        if num_external_tokens <= 0:  # all local hits: the prefill side may free its blocks
            self._to_release.append(BlockRelease(req_id, remote))
            self.health.cancel(remote.engine_id, req_id)  # no pull: no outcome will come
            return
        ranges = needed_ranges(
            self.groups, num_computed, num_computed + num_external_tokens, self.block_size
        )
        local, remote_ids = pull_pairs(ranges, remote, block_ids, local_null or _never_null)
        self._to_recv.append(BlockPull(req_id, local, remote_ids, remote))
        self.pulling.add(req_id)
        self.health.pulling(req_id, remote.engine_id)
        self._pull_started[req_id] = time.monotonic()
        self.stats.pulls += 1
        self.stats.pull_tokens += num_external_tokens

    # --- prefill side ---------------------------------------------------------------------

    def finished(
        self, request: "Request", block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict | None]:
        """request_finished(_all_groups): keep a prefilled request's blocks (every group's)
        for the decode side."""
        req_id = str(request.request_id)
        params = request.kv_transfer_params or {}
        if (looked_up := self.lookups.pop(req_id, None)) is not None:
            self._to_release.append(BlockRelease(req_id, looked_up[0]))  # aborted before alloc
            self.health.cancel(looked_up[0].engine_id, req_id)
        if req_id in self.pulling:
            return True, None  # the read still writes into them: freed on finished_recving
        if not params.get("do_remote_decode") or not any(block_ids):
            return False, None
        if getattr(request.status, "name", "") not in _FINISHED_OK:
            return False, None  # aborted: nobody will read them
        return True, self._hold(request, block_ids).to_params()

    def _hold(self, request: "Request", block_ids: tuple[list[int], ...]) -> RemotePrefill:
        req_id = str(request.request_id)
        deadline = time.time() + self.config.lease_timeout_s
        tails = held_tails(block_ids, self.null_block_id)
        held = HeldBlocks(req_id, tails, deadline, self.registration)
        self.held_for_readers[req_id] = held
        self._lease_ids[req_id] = next_lease_id()
        self._to_send.append(held)
        self.stats.held += 1
        add_event(names.EVENT_LEASE_ACQUIRED, **self._lease_attributes(held))
        return RemotePrefill(
            self.engine_id,
            req_id,
            self.config.side_channel_host,
            self.config.side_channel_port,
            tails,
            request.num_computed_tokens,
            self.block_size,
            deadline,
            max(len(group) for group in block_ids),
            self.registration,
        )

    # --- per step -------------------------------------------------------------------------

    def build_metadata(self) -> P2PMetadata:
        metadata = P2PMetadata(self._to_recv, self._to_release, self._to_send, self.registration)
        self._to_recv, self._to_release, self._to_send = [], [], []
        return metadata

    def on_worker_output(
        self,
        worker_meta: P2PWorkerMeta | None,
        finished_sending: set[str],
        finished_recving: set[str],
    ) -> None:
        meta = worker_meta if isinstance(worker_meta, P2PWorkerMeta) else P2PWorkerMeta()
        # A worker registered again with no reset before (a sleep that kept the cache): later
        # leases name at least its registration.
        self.registration = max(self.registration, meta.registration)
        for req_id in finished_sending:
            self._end_lease(req_id, expired=req_id in meta.leases_expired)
        self.health.failed(meta.loads_failed)  # kept until every rank reported the pull
        for req_id in finished_recving:
            self.pulling.discard(req_id)
            self._pull_ended(req_id, self.health.ended(req_id))
        self.stats.tier_bypasses = self.health.bypasses
        self.stats.tier_bypassed_lookups = self.health.bypassed_lookups

    def _pull_ended(self, req_id: str, cause: str | None) -> None:
        """Once per pull, when every rank reported it: its wait and, if it failed, why."""
        if (started := self._pull_started.pop(req_id, None)) is not None:
            self.samples.observe("kv_wait_seconds", time.monotonic() - started)
        if cause is not None:
            self.stats.failed_pulls += 1
            self.samples.fail(failure_kind(cause), self.failure_outcome or "left_to_parent")

    def report_values(self) -> tuple[dict[str, int], dict[str, int]]:
        """Cumulative counters and the gauges now, for the connector's stats."""
        gauges = {
            "held_requests": len(self.held_for_readers),
            "pulls_in_flight": len(self.pulling),
            "peers": len(self.health.peers),
            "peers_bypassed": self.health.bypassed_peers(),
        }
        return self.stats.as_dict(), gauges

    def held(self) -> dict[str, object]:
        """What this half still holds, by kind (all falsy when idle and leak-free)."""
        return {
            "held_for_readers": sorted(self.held_for_readers),
            "lookups": sorted(self.lookups),
            "pulling": sorted(self.pulling),
            "pull_timers": sorted(self._pull_started),
        }

    def _end_lease(self, req_id: str, expired: bool) -> None:
        held = self.held_for_readers.pop(req_id, None)
        if held is None:
            return
        attributes = self._lease_attributes(held)
        self._lease_ids.pop(req_id, None)
        if expired:
            self.stats.leases_expired += 1
            add_event(names.EVENT_LEASE_EXPIRED, **attributes)
        outcome = "expired" if expired else "released"
        add_event(names.EVENT_LEASE_RELEASED, **attributes, **{names.LEASE_OUTCOME: outcome})

    def _lease_attributes(self, held: HeldBlocks) -> dict[str, Any]:
        return {
            names.LEASE_ID: self._lease_ids.get(held.req_id, 0),
            names.LEASE_HOLDER: held.req_id,
            names.LEASE_TIMEOUT_S: self.config.lease_timeout_s,
            **held_block_attributes(held.block_ids),
        }


def _never_null(group: int, index: int) -> bool:
    return False
