"""NIXL transport: registers a KV cache, READs peers' blocks into it, reports results and notifs.

It can lend the KV cache's memory away (vLLM's sleep and weight updates): suspend() fails its
reads, waits until NIXL let go of each and deregisters; resume() registers the memory again.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from kvscope.connector.p2p.transport.cuda_threads import device_binder
from kvscope.connector.p2p.transport.layout import KVLayout, check_compatible
from kvscope.connector.p2p.transport.nixl_agent import (
    as_str,
    new_agent,
    prepare_peer,
    read_facts,
    register_layout,
    try_cleanup,
)
from kvscope.connector.p2p.transport.notif_inbox import NotifInbox
from kvscope.connector.p2p.transport.pacing import TransportConfig, next_poll_delay
from kvscope.connector.p2p.transport.peers import Peer
from kvscope.connector.p2p.transport.poller import PollerStats, ProgressPoller
from kvscope.connector.p2p.transport.reads import Inflight, ReadBook
from kvscope.connector.p2p.transport.results import (
    PeerNotif,
    PeerRejectedError,
    TransferResult,
    TransportError,
    describe_failure,
)
from kvscope.connector.p2p.transport.side_channel import PeerInfo
from kvscope.connector.p2p.transport.ucx_lanes import ReadLanes, read_lanes

logger = logging.getLogger(__name__)

LENT_CAUSE = "the KV cache was lent away (vLLM's sleep or a weight update)"
"""Why reads fail while the memory is deregistered."""


class NixlTransport:
    """One NIXL agent (UCX, no progress thread) over one process's KV cache, plus its poller."""

    def __init__(
        self,
        engine_id: str,
        kv_caches: dict[str, torch.Tensor],
        tp_rank: int = 0,
        tp_size: int = 1,
        config: TransportConfig | None = None,
        kv_layout: Any = None,
        num_blocks: int | None = None,
        tensor_strides: tuple[int, int] | None = None,
    ) -> None:
        """`kv_layout`, `num_blocks`, `tensor_strides`: what vLLM says about the views (the
        resolved layout, the manager's block count, the KVCacheTensor's strides; see
        KVLayout.from_layer_tensors)."""
        self.layout = KVLayout.from_layer_tensors(
            engine_id, kv_caches, tp_rank, tp_size, kv_layout, num_blocks, tensor_strides
        )
        self._kv_caches = dict(kv_caches)  # registered memory must outlive the agent's use of it
        # Every thread that calls NIXL over this memory runs it first (a CUDA context for UCX).
        self.bind_thread = device_binder(kv_caches.values())
        self.config = config or TransportConfig()
        self._lock = threading.Condition()  # our state, and NIXL calls on the engine's path
        self._setup_lock = threading.Lock()  # handshakes (slow NIXL calls) outside self._lock
        self._agent, self.agent_name = new_agent(engine_id, tp_rank)
        self._registered, self._local_dlists = register_layout(self._agent, self.layout)
        self._peers: dict[str, Peer] = {}
        self._reads = ReadBook()
        self._inbox = NotifInbox()
        self._next_xfer_id = 0
        self._closed = False
        self._suspended = False
        self.registrations = 1  # how many times the memory was registered (resume() adds one)
        self._last_event = time.monotonic()  # a read posted or ended, a notif, an expectation
        self._poller = ProgressPoller(
            self._progress, self.config.busy_interval_s, on_start=self.bind_thread
        )

    # --- handshake -------------------------------------------------------------------------

    def peer_info(self) -> PeerInfo:
        """What to publish on the side channel so that peers can read our blocks."""
        with self._lock:
            return PeerInfo(self.agent_name, self._agent.get_agent_metadata(), self.layout)

    def add_peer(self, agent_metadata: bytes, layout: KVLayout) -> str:
        """Accept a peer's agent; returns its name, the `peer` of later calls.

        Slow: NIXL loads the peer's metadata, prepares its descriptors (layers x blocks of
        them with LB* layouts) and connects. Call it off the engine thread (BlockPuller does):
        the transport lock is taken only to record the peer, so reads, polls and notifications
        of other peers go on meanwhile (NIXL serialises its own calls, see new_agent)."""
        try:
            mapping = check_compatible(self.layout, layout)
        except ValueError as exc:
            raise PeerRejectedError(str(exc)) from None
        with self._setup_lock:  # one handshake at a time: a re-added name replaces its handle
            self._check_open()
            name, remote_dlist = prepare_peer(
                self._agent, self.agent_name, agent_metadata, layout, mapping.per_block
            )
            with self._lock:
                replaced = self._peers.pop(name, None)
                if not self._closed:
                    self._peers[name] = Peer(name, layout, mapping, remote_dlist)
            if replaced is not None:
                replaced.release(self._agent, forget_agent=False)
            if self._closed:  # closed while NIXL prepared it: nothing may use it now
                try_cleanup(self._agent.release_dlist_handle, remote_dlist)
                try_cleanup(self._agent.remove_remote_agent, name)
                raise TransportError("the transport was closed during the handshake")
        self._poller.keep_hot(self.config.hot_after_activity_s)
        return name

    def remove_peer(self, peer: str) -> None:
        """Forget a peer (e.g. after it failed); its in-flight reads fail on their next check."""
        with self._lock:
            removed = self._peers.pop(peer, None)
            if removed is not None:
                removed.release(self._agent)

    @property
    def poller_stats(self) -> PollerStats:
        """How often the progress thread ran (idle CPU is steps times a step's cost)."""
        return self._poller.stats

    def expect_activity(self, seconds: float) -> None:
        """Poll fast for a while: a peer handshook and will connect or read soon."""
        self._poller.keep_hot(seconds)

    # --- reads -----------------------------------------------------------------------------

    def read_blocks(
        self,
        peer: str,
        remote_block_ids: list[int],
        local_block_ids: list[int],
        notif_msg: bytes = b"",
        timeout_s: float | None = None,
    ) -> int:
        """Start a READ of whole blocks (every layer) from the peer; returns the transfer id.

        It never raises for a bad peer or bad ids: those come back as a failed result.
        `notif_msg` reaches the peer's get_notifs() once the read is complete.
        """
        timeout_s = self.config.transfer_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self._check_open()
            self._next_xfer_id += 1
            xfer = Inflight(self._next_xfer_id, peer, None, len(remote_block_ids))
            try:
                state = self._post_read(xfer, remote_block_ids, local_block_ids, notif_msg)
                xfer.deadline = xfer.started + timeout_s
            except Exception as exc:
                cause = (
                    exc.args[0] if isinstance(exc, TransportError) else describe_failure(exc, peer)
                )
                self._finish(xfer, cause)
                return xfer.xfer_id
            self._last_event = time.monotonic()
            if state == "PROC":
                self._reads.inflight[xfer.xfer_id] = xfer
            else:
                if state == "DONE" and xfer.handle is not None:
                    xfer.ended = time.monotonic()
                    xfer.nixl = read_facts(self._agent, xfer.handle)
                self._finish(
                    xfer, "" if state == "DONE" else f"NIXL could not post the read: {state}"
                )
        self._poller.wake()
        return xfer.xfer_id

    def _post_read(
        self, xfer: Inflight, remote_ids: list[int], local_ids: list[int], notif_msg: bytes
    ) -> str:
        if self._suspended:
            raise TransportError(LENT_CAUSE)
        peer = self._peers.get(xfer.peer)
        if peer is None:
            raise TransportError(f"unknown peer {xfer.peer!r}: handshake and call add_peer first")
        return peer.post_read(
            self._agent,
            self._local_dlists,
            xfer,
            remote_ids,
            local_ids,
            notif_msg,
            self.layout.bytes_per_block,
        )

    def read_lanes(self) -> ReadLanes:
        """The UCX lanes this agent's reads use, as UCX itself reported choosing them."""
        return read_lanes(self.agent_name, self.layout.memory_kind)

    def poll(self) -> list[TransferResult]:
        """Transfers that finished or failed since the last call."""
        with self._lock:
            results, self._reads.results = list(self._reads.results.values()), {}
            in_flight = bool(self._reads.inflight)
        if in_flight:
            # The poller thread needs the GIL to progress them; the engine thread polls every
            # step and would otherwise hold it up to a switch interval (5 ms) at a time.
            time.sleep(0)
        return results

    def wait(self, xfer_ids: list[int], timeout_s: float) -> list[TransferResult]:
        """Block until these transfers end (or timeout_s passes); returns those that ended."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            results = self._reads.results
            while not all(i in results for i in xfer_ids):
                if not self._lock.wait(timeout=max(0.0, deadline - time.monotonic())):
                    break
            return [results.pop(i) for i in xfer_ids if i in results]

    # --- notifications (the owner's side of a read) ----------------------------------------

    def expect_remote_read(self, notif_msg: bytes, timeout_s: float) -> None:
        """A peer should read our blocks and notify `notif_msg` within timeout_s: poll fast."""
        with self._lock:
            self._last_event = time.monotonic()
            self._inbox.expect(notif_msg, self._last_event + timeout_s)
        self._poller.wake()

    def get_notifs(self) -> list[PeerNotif]:
        """Notifications received since the last call (peers' completed reads)."""
        with self._lock:
            return self._inbox.take_received()

    def expired_remote_reads(self) -> list[bytes]:
        """Expected reads whose notification did not come in time (free their blocks)."""
        with self._lock:
            return self._inbox.take_expired()

    def send_notif(self, peer: str, message: bytes) -> None:
        """Send a standalone notification, e.g. 'abort: free the blocks of request X'."""
        with self._lock:
            try:
                self._agent.send_notif(peer, message)
            except Exception as exc:
                raise TransportError(describe_failure(exc, peer)) from None
        self._poller.keep_hot(self.config.hot_after_activity_s)

    # --- progress --------------------------------------------------------------------------

    def _progress(self) -> float | None:
        """One poller step: progress NIXL, settle transfers, expire expectations.

        Returns the seconds until the next step (None: until woken)."""
        with self._lock:
            if self._closed:
                return None
            self._collect_notifs()
            now = time.monotonic()
            inflight = list(self._reads.inflight.values())
            ended = [self._reads.check(self._agent, xfer, now) for xfer in inflight]
            self._inbox.expire(now)
            if self._reads.retry_releases() or any(ended):
                self._on_results()
            return next_poll_delay(
                self.config,
                now,
                bool(self._reads.inflight),
                self._inbox.waiting,
                self._last_event,
                self._reads.pending_release,
            )

    def _collect_notifs(self) -> None:
        try:
            notifs = self._agent.get_new_notifs()  # also what lets peers' READs complete
        except Exception as exc:
            logger.warning("p2p: NIXL get_new_notifs failed: %s", exc)
            return
        for peer, messages in notifs.items():
            for message in messages:
                self._inbox.receive(as_str(peer), message)
        if any(notifs.values()):
            self._last_event = time.monotonic()

    def _finish(self, xfer: Inflight, cause: str) -> None:
        """End a read: its result comes once NIXL released it (see reads.ReadBook)."""
        if self._reads.end(xfer, cause):
            self._on_results()

    def _on_results(self) -> None:
        self._lock.notify_all()
        self._last_event = time.monotonic()
        self._poller.keep_hot(self.config.hot_after_activity_s)  # its notif may still be sending

    # --- lending the memory away ---------------------------------------------------------

    @property
    def suspended(self) -> bool:
        return self._suspended

    def suspend(self, timeout_s: float) -> None:
        """Let go of the KV cache's memory: fail every read into it (waiting until NIXL released
        each, so nothing writes there once this returns), forget peers and expected reads,
        deregister. Reads posted until resume() fail. If NIXL still holds a read after
        timeout_s, TransportError, and the memory stays registered and in use."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            self._check_open()
            if self._suspended:
                return
            self._suspended = True  # no read is posted from here on
            for xfer in list(self._reads.inflight.values()):
                self._reads.end(xfer, LENT_CAUSE)
            while self._reads.releasing or self._reads.unreleased:
                self._collect_notifs()  # progresses the agent, so cancellations complete
                self._reads.retry_releases()
                if time.monotonic() > deadline:
                    if not self._reads.releasing:
                        break  # only handles of completed reads are left: nothing writes
                    self._suspended = False
                    self._on_results()
                    raise TransportError(
                        f"NIXL did not release {len(self._reads.releasing)} cancelled reads"
                        f" within {timeout_s:.0f} s: the KV cache stays registered"
                    )
                self._lock.wait(timeout=self.config.busy_interval_s)
            self._on_results()
            for peer in list(self._peers):
                self.remove_peer(peer)
            self._inbox.forget_expected()
            for local_dlist in self._local_dlists.values():
                try_cleanup(self._agent.release_dlist_handle, local_dlist)
            self._local_dlists = {}
            try_cleanup(self._agent.deregister_memory, self._registered)
            self._registered = None
        logger.info("p2p: %s deregistered its KV cache: %s", self.agent_name, LENT_CAUSE)

    def resume(self) -> None:
        """Register the KV cache's memory again (vLLM gives it back at the same addresses);
        peers must handshake again to read it (P2PWorker republishes the agent)."""
        with self._lock:
            self._check_open()
            if not self._suspended:
                return
            self._registered, self._local_dlists = register_layout(self._agent, self.layout)
            self.registrations += 1
            self._suspended = False
            self._last_event = time.monotonic()
        logger.info("p2p: %s registered its KV cache again", self.agent_name)

    # --- lifetime --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError("the transport is closed")

    def close(self) -> None:
        """Fail in-flight reads (held ones reported now), release NIXL handles, deregister."""
        self._poller.stop()
        with self._lock:
            if self._closed:
                return
            self._reads.close("the transport was closed during the read")
            self._lock.notify_all()
            self._closed = True
            for peer in list(self._peers):
                self.remove_peer(peer)
            for local_dlist in self._local_dlists.values():
                try_cleanup(self._agent.release_dlist_handle, local_dlist)
            if self._registered is not None:
                try_cleanup(self._agent.deregister_memory, self._registered)

    def __enter__(self) -> NixlTransport:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
