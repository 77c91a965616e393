"""One tier-health breaker per prefill peer (remote engine id): a sick peer is bypassed."""

from kvscope.connector.common.tier_health import TierHealth, TierHealthConfig, TierState

MAX_PEERS = 64
"""Breakers kept at most; healthy ones with no failures and no probe are dropped first."""


class PeerHealth:
    """Breakers by remote engine id, the peer of each pull in flight, and pulls' failures.

    vLLM reports a pull in finished_recving once every rank reported it (its
    KVOutputAggregator counts to the world size), while the causes of failed pulls come in
    each step's worker metadata: a cause is kept until the pull ends, so an outcome is
    recorded once, when the last rank reported, failed if any rank failed it.
    """

    def __init__(self, config: TierHealthConfig | None = None, engine_id: str | None = None):
        self.config = config or TierHealthConfig()
        self.engine_id = engine_id  # this (decode) engine's, named on the breakers' spans
        self.peers: dict[str, TierHealth] = {}
        self.peer_of: dict[str, str] = {}  # decode request id -> remote engine id
        self._failed: dict[str, str] = {}  # decode request id -> the first cause reported
        self.bypasses = 0
        self.bypassed_lookups = 0

    def admit(self, engine_id: str, req_id: str) -> TierHealth | None:
        """None if the lookup may pull from the peer now, else the peer's (bypassed) breaker."""
        health = self.peers.get(engine_id)
        if health is None:
            health = self.peers[engine_id] = TierHealth(
                f"p2p:{engine_id}", self.config, engine_id=self.engine_id
            )
            self._bound(keep=engine_id)
        if health.admit(req_id):
            return None
        self.bypassed_lookups += 1
        return health

    def cancel(self, engine_id: str, req_id: str) -> None:
        """The admitted lookup of req_id will not pull: the next lookup may probe instead."""
        if (health := self.peers.get(engine_id)) is not None:
            health.cancel(req_id)

    def pulling(self, req_id: str, engine_id: str) -> None:
        self.peer_of[req_id] = engine_id

    def failed(self, causes: dict[str, str]) -> None:
        """One step's failed pulls (any rank's), with the puller's cause."""
        for req_id, cause in causes.items():
            if req_id in self.peer_of:
                self._failed.setdefault(req_id, cause)

    def ended(self, req_id: str) -> str | None:
        """The pull of req_id ended on every rank: its outcome goes to its peer's breaker.
        Returns the first cause a rank reported, None when the pull succeeded."""
        engine_id = self.peer_of.pop(req_id, None)
        cause = self._failed.pop(req_id, None)
        if engine_id is None or (health := self.peers.get(engine_id)) is None:
            return cause
        before = health.bypasses
        health.record(req_id, ok=cause is None, reason=cause or "")
        self.bypasses += health.bypasses - before
        return cause

    def bypassed_peers(self) -> int:
        return sum(h.state is not TierState.HEALTHY for h in self.peers.values())

    def _bound(self, keep: str) -> None:
        if len(self.peers) <= MAX_PEERS:
            return
        in_flight = {keep, *self.peer_of.values()}
        for engine_id, health in list(self.peers.items()):
            idle = health.state is TierState.HEALTHY and not health.failures
            if idle and engine_id not in in_flight and len(self.peers) > MAX_PEERS:
                del self.peers[engine_id]
