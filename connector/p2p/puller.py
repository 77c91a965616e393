"""Decode side of the worker half: handshakes with prefill peers and READs their blocks.

A read is started only before the lease deadline (less a margin) and accepted only if it was
seen complete before that point: the prefill side frees the blocks at the deadline, so a read
that could have overlapped the free is reported as a load error, never used.
"""

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from kvscope.connector.common.stats_schema import Samples
from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import BlockPull, BlockRelease, done_notif
from kvscope.connector.p2p.stats import ReadCounters
from kvscope.connector.p2p.trace_spans import (
    pulled_block_attributes,
    record_handshake,
    transport_attributes,
)
from kvscope.connector.p2p.transport.nixl_transport import NixlTransport
from kvscope.connector.p2p.transport.results import TransferResult, TransportError
from kvscope.connector.p2p.transport.side_channel import PeerInfo, fetch_peer_info
from kvscope.traces import names
from kvscope.traces.facts import add_event, record_transfer

logger = logging.getLogger(__name__)

PeerKey = tuple[str, int, str]  # side-channel host, port, engine id

_REVOKED = (
    "the prefill server registered its KV cache again since this lease (vLLM's sleep or a"
    " weight update): its blocks are gone"
)


@dataclass
class _Registration:
    """What this side knows of a peer's KV cache registration (RemotePrefill.registration)."""

    floor: int = 0  # the peer's own, at the last handshake: older leases were revoked
    covered: int = 0  # the newest any lease named: a handshake begun before it is stale


@dataclass
class _Handshake:
    """A handshake in the executor, and the requests that wait for it.

    Pulls wait for poll() on the engine thread (their results are the engine's state).
    Releases go out from the executor as soon as the peer is added: a finished request's
    engine may not step again, and the prefill side would hold its blocks until the lease ends.
    """

    future: Future
    started: float  # monotonic
    req_id: str  # the request that asked first: its trace holds the handshake's span
    registration: int  # the newest registration leases had named when it began
    waiting: list[BlockPull] = field(default_factory=list)
    releases: list[BlockRelease] = field(default_factory=list)  # under `lock`
    agent: str | None = None  # the peer's name once added; under `lock`
    lock: threading.Lock = field(default_factory=threading.Lock)


class BlockPuller:
    """Owns the decode side's peers, handshakes and reads; reports them per poll."""

    def __init__(
        self,
        transport: NixlTransport,
        config: P2PConfig,
        failure_policy: str = "recompute",
        failure_outcome: str | None = None,
        tp_rank: int = 0,
    ) -> None:
        self.transport = transport
        self.tp_rank = tp_rank  # pulls only its own shard, from the peer's rank of the same number
        self.config = config
        self.failure_policy = failure_policy
        self.failure_outcome = failure_outcome  # None inside a Multi, which says it
        self._peers: dict[PeerKey, str] = {}  # -> NIXL agent name
        self._registrations: dict[PeerKey, _Registration] = {}
        self._handshakes: dict[PeerKey, _Handshake] = {}
        self._executor = ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="kvscope-p2p-hs", initializer=transport.bind_thread
        )
        self._reads: dict[int, BlockPull] = {}  # transfer id -> pull
        self._recving: set[str] = set()
        self.load_errors: set[int] = set()
        self.failed_loads: set[str] = set()  # request ids, for vLLM's failed_recving
        self.loads_failed: dict[str, str] = {}  # since the last take
        self.stats = ReadCounters()
        self.samples = Samples()  # per-read durations and sizes for the stats' histograms

    def start(self, pulls: list[BlockPull], releases: list[BlockRelease]) -> None:
        for item in [*pulls, *releases]:
            key = (item.remote.host, item.remote.port, item.remote.engine_id)
            self._follow_registration(key, item.remote.registration)
            if key in self._peers:
                self._issue(item, self._peers[key])
            else:
                handshake = self._handshakes.get(key) or self._begin_handshake(key, item)
                if isinstance(item, BlockRelease):
                    self._release_when_added(handshake, item)
                else:
                    handshake.waiting.append(item)

    def _follow_registration(self, key: PeerKey, registration: int) -> None:
        """A lease names a newer registration: the peer registered its KV cache again (after
        vLLM's sleep or a weight update), and what was loaded of its agent before describes
        memory it let go of; handshake again."""
        known = self._registrations.setdefault(key, _Registration())
        if registration <= known.covered:
            return
        known.covered = registration
        if (agent := self._peers.pop(key, None)) is not None:
            self.transport.remove_peer(agent)

    def forget_peers(self) -> None:
        """Our own KV cache was lent away: the transport dropped every peer; so do we."""
        self._peers.clear()

    def _begin_handshake(self, key: PeerKey, item: BlockPull | BlockRelease) -> _Handshake:
        """The whole handshake runs in the executor: with LB* layouts NIXL prepares layers x
        blocks descriptors for the peer (millions on a large GPU), which would stall a step."""
        timeout_s = min(self.config.handshake_timeout_s, max(self._time_left(item), 0.1))
        future = self._executor.submit(self._handshake, key, timeout_s)
        covered = self._registrations[key].covered
        handshake = _Handshake(future, time.monotonic(), item.req_id, covered)
        self._handshakes[key] = handshake
        future.add_done_callback(lambda _: self._send_releases(handshake))
        return handshake

    def _handshake(self, key: PeerKey, timeout_s: float) -> tuple[str, int]:
        """Fetch the peer's agent and layout over the side channel and add it: its agent name,
        and its registration."""
        host, port, engine_id = key  # the peer's rank 0 port, from its kv_transfer_params
        info: PeerInfo = fetch_peer_info(host, port + self.tp_rank, self.tp_rank, timeout_s)
        if info.layout.engine_id != engine_id:
            raise TransportError(
                f"side channel {host}:{port} serves engine {info.layout.engine_id!r},"
                f" not {engine_id!r}: the prefill server restarted or the port is reused"
            )
        return self.transport.add_peer(info.agent_metadata, info.layout), info.registration

    def _release_when_added(self, handshake: _Handshake, release: BlockRelease) -> None:
        with handshake.lock:
            if handshake.agent is None:
                handshake.releases.append(release)
                return
        self._issue(release, handshake.agent)

    def _send_releases(self, handshake: _Handshake) -> None:
        """In the executor, once the handshake ended (a failed one drops them: the prefill
        side's leases free those blocks)."""
        if handshake.future.cancelled() or handshake.future.exception() is not None:
            return
        with handshake.lock:
            handshake.agent = handshake.future.result()[0]
            releases, handshake.releases = handshake.releases, []
        for release in releases:
            try:
                self._issue(release, handshake.agent)
            except TransportError as exc:  # closed meanwhile: the lease frees the blocks
                logger.debug("p2p: could not release %s: %s", release.req_id, exc)

    def poll(self) -> set[str]:
        """finished_recving: pulls that ended (failed ones also name their blocks as errors)."""
        for key, handshake in list(self._handshakes.items()):
            if handshake.future.done():
                del self._handshakes[key]
                self._end_handshake(key, handshake)
            else:
                self._expire_waiting(handshake)
        for result in self.transport.poll():
            if (pull := self._reads.pop(result.xfer_id, None)) is not None:
                self._end_read(pull, result)
        recving, self._recving = self._recving, set()
        return recving

    def _expire_waiting(self, handshake: _Handshake) -> None:
        """A handshake NIXL keeps busy past the side channel's own bound (handshake_timeout_s)
        must not hold a pull past its lease: that pull fails (and is recomputed) now; the
        handshake goes on for the peer's later requests. Before that bound the handshake's own
        answer (e.g. an unreachable peer) is the cause a user should see."""
        if time.monotonic() - handshake.started <= self.config.handshake_timeout_s:
            return
        waiting = []
        for item in handshake.waiting:
            if self._time_left(item) > 0:
                waiting.append(item)
            else:
                self._fail(item, "lease expired during the handshake", "lease_expired")
        handshake.waiting = waiting

    def _end_handshake(self, key: PeerKey, handshake: _Handshake) -> None:
        try:
            agent, registration = handshake.future.result()
        except Exception as exc:  # SideChannelError, PeerRejectedError (layout), TransportError
            cause = f"handshake failed: {exc}"
            record_handshake(handshake.req_id, key, handshake.started, time.monotonic(), cause)
            for item in handshake.waiting:
                self._fail(item, cause, "peer_unreachable")
            return
        self.stats.handshakes += 1
        record_handshake(handshake.req_id, key, handshake.started, time.monotonic(), None)
        known = self._registrations[key]
        if handshake.registration < known.covered:
            # The peer registered again while we loaded its agent: load it once more.
            self.transport.remove_peer(agent)
            self.start(handshake.waiting, [])
            return
        known.floor = max(known.floor, registration)
        known.covered = max(known.covered, known.floor)
        self._peers[key] = agent
        for item in handshake.waiting:
            self._issue(item, agent)

    def _issue(self, item: BlockPull | BlockRelease, agent: str) -> None:
        notif = done_notif(item.remote.request_id)
        if isinstance(item, BlockRelease):
            self.transport.read_blocks(agent, [], [], notif)  # a notification only
            return
        time_left_s = self._time_left(item)
        if time_left_s <= 0:
            self._fail(item, "lease expired before the read could start", "lease_expired")
            return
        key = (item.remote.host, item.remote.port, item.remote.engine_id)
        if item.remote.registration < self._registrations[key].floor:
            self._fail(item, _REVOKED, "lease_expired")
            return
        timeout_s = min(self.config.read_timeout_s, time_left_s)
        xfer_id = self.transport.read_blocks(
            agent, item.flat_remote, item.flat_local, notif, timeout_s
        )
        self._reads[xfer_id] = item

    def _end_read(self, pull: BlockPull, result: TransferResult) -> None:
        cause = result.cause or None
        if cause is None and self._time_left(pull) < 0:
            cause = "lease expired during the read: the prefill side may have freed the blocks"
        # The read's own window (post .. seen over), not this poll's: bytes and time agree.
        end = result.ended_s or time.monotonic()
        descriptors = result.descriptors
        lanes = self.transport.read_lanes()
        record_transfer(
            pull.req_id,
            "p2p_read",
            result.nbytes,
            end - result.duration_s,
            end,
            error=cause,
            **{names.TRANSFER_PEER: pull.remote.engine_id, names.TRANSFER_DESCRIPTORS: descriptors},
            **pulled_block_attributes(pull),
            **transport_attributes(result, lanes, self.transport.layout.memory_kind),
        )
        if cause is not None:
            kind = "lease_expired" if "lease expired" in cause else "read_failed"
            self._release_quietly(pull, result.peer)
            self._forget_peer(pull)
            self._fail(pull, cause, kind)
            return
        self.stats.reads += 1
        self.stats.read_bytes += result.nbytes
        self.stats.read_s += result.duration_s
        self.samples.observe("read_seconds", result.duration_s)
        self.samples.observe("read_size_bytes", result.nbytes)
        self._recving.add(pull.req_id)
        add_event(
            names.EVENT_BLOCK_LOADED,
            **{names.REQUEST_ID: pull.req_id, names.BLOCK_TIER: "device"},
            **pulled_block_attributes(pull),
        )

    def _fail(self, item: BlockPull | BlockRelease, cause: str, kind: str) -> None:
        logger.warning("p2p: request %s: %s", item.req_id, cause)
        if isinstance(item, BlockRelease):
            return  # nothing was loaded; the prefill side's lease frees its blocks
        self.stats.failed_reads += 1
        self.load_errors.update(item.flat_local)
        self.failed_loads.add(item.req_id)
        self.loads_failed[item.req_id] = f"{kind}: {cause}"
        self._recving.add(item.req_id)
        add_event(
            names.EVENT_LOAD_FAILED,
            **{
                names.REQUEST_ID: item.req_id,
                names.FAILURE_CAUSE: f"{kind}: {cause}",
                names.FAILURE_POLICY: self.failure_policy,
                names.FAILURE_OUTCOME: self.failure_outcome,
            },
            **pulled_block_attributes(item),
        )

    def _release_quietly(self, pull: BlockPull, agent: str) -> None:
        """The read was cancelled and its blocks will be recomputed: the prefill side may free
        its blocks now rather than at the lease deadline (a dead peer just misses this)."""
        try:
            self.transport.send_notif(agent, done_notif(pull.remote.request_id))
        except TransportError as exc:
            logger.debug("p2p: could not release %s early: %s", pull.req_id, exc)

    def _forget_peer(self, pull: BlockPull) -> None:
        """After a failed read, the next request handshakes again (the peer may have restarted)."""
        key = (pull.remote.host, pull.remote.port, pull.remote.engine_id)
        if (agent := self._peers.pop(key, None)) is not None:
            self.transport.remove_peer(agent)

    def _time_left(self, item: BlockPull | BlockRelease) -> float:
        """Seconds until the last moment a read of these blocks may end and still be trusted."""
        deadline = item.remote.lease_deadline_unix_s - self.config.lease_margin_s
        return deadline - time.time()

    def held(self) -> dict[str, object]:
        """Reads started and not ended (their requests), and handshakes not ended (their
        peers, host:port engine) with the requests waiting for them."""
        return {
            "reads_in_flight": sorted(pull.req_id for pull in self._reads.values()),
            "handshakes_in_flight": {
                f"{host}:{port} {engine}": sorted(item.req_id for item in handshake.waiting)
                for (host, port, engine), handshake in self._handshakes.items()
            },
        }

    def connected_engines(self) -> set[str]:
        """Engine ids of the peers this puller holds a NIXL connection to."""
        return {engine for _, _, engine in self._peers}

    def take_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    def take_failed_loads(self) -> set[str]:
        """Requests whose pull failed since the last call (each also in finished_recving)."""
        failed, self.failed_loads = self.failed_loads, set()
        return failed

    def take_loads_failed(self) -> dict[str, str]:
        failed, self.loads_failed = self.loads_failed, {}
        return failed

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
