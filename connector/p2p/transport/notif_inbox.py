"""Notifications received from peers, and the reads an owner still waits to be told about."""

from __future__ import annotations

from kvscope.connector.p2p.transport.results import PeerNotif


class NotifInbox:
    """Not thread-safe on its own: the transport calls it under its lock."""

    def __init__(self) -> None:
        self._received: list[PeerNotif] = []
        self._expected: dict[bytes, float] = {}  # notif message -> monotonic deadline
        self._expired: list[bytes] = []

    @property
    def waiting(self) -> bool:
        """True while some expected read has neither been notified nor expired."""
        return bool(self._expected)

    def expect(self, message: bytes, deadline: float) -> None:
        self._expected[message] = deadline

    def receive(self, peer: str, message: bytes) -> None:
        self._received.append(PeerNotif(peer, message))
        self._expected.pop(message, None)

    def forget_expected(self) -> None:
        """The blocks those reads would read are gone (the KV cache was lent away)."""
        self._expected.clear()

    def expire(self, now: float) -> None:
        for message, deadline in list(self._expected.items()):
            if now > deadline:
                del self._expected[message]
                self._expired.append(message)

    def take_received(self) -> list[PeerNotif]:
        received, self._received = self._received, []
        return received

    def take_expired(self) -> list[bytes]:
        expired, self._expired = self._expired, []
        return expired
