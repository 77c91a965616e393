"""What the P2P transport reports: finished or failed transfers, peers' notifications, errors."""

from __future__ import annotations

from dataclasses import dataclass


class TransportError(RuntimeError):
    """A transport call could not be done; the message says why and what to do next."""


class PeerRejectedError(TransportError):
    """add_peer refused a peer: its layout does not match ours or NIXL refused its metadata."""


@dataclass(frozen=True)
class NixlReadFacts:
    """What NIXL itself said of one completed read: its backend, and its own telemetry."""

    backend: str  # nixl_agent.query_xfer_backend, e.g. 'UCX'; 'unknown' if NIXL did not say
    total_bytes: int | None = None  # get_xfer_telemetry().totalBytes; None without telemetry
    xfer_us: int | None = None  # NIXL's post-to-completion time of the read


@dataclass(frozen=True)
class TransferResult:
    """How one read_blocks call ended; `cause` is empty exactly when it succeeded."""

    xfer_id: int
    peer: str  # the remote NIXL agent name, as returned by add_peer
    num_blocks: int
    nbytes: int
    duration_s: float
    cause: str = ""
    descriptors: int = 0  # NIXL descriptors it moved: blocks x (1, or layers)
    ended_s: float = 0.0  # monotonic: when the read was seen over; minus duration_s, its post
    nixl: NixlReadFacts | None = None  # None when NIXL never ran it (or it failed)

    @property
    def ok(self) -> bool:
        return not self.cause

    @property
    def bytes_per_s(self) -> float:
        return self.nbytes / self.duration_s if self.duration_s > 0 else 0.0


@dataclass(frozen=True)
class PeerNotif:
    """A notification a peer sent us, e.g. 'I finished reading the blocks of request X'."""

    peer: str  # the remote NIXL agent name
    message: bytes


def describe_failure(exc: BaseException, peer: str) -> str:
    """A cause string for a NIXL exception, saying what probably happened."""
    kind = type(exc).__name__
    if kind == "nixlRemoteDisconnectError":
        return (
            f"peer {peer} disconnected ({kind}): its process died or closed its agent;"
            " handshake with a live peer and read again, or recompute"
        )
    if kind == "nixlNotFoundError":
        return f"peer {peer} is not known to NIXL ({kind}): call add_peer after a new handshake"
    return f"NIXL failed reading from peer {peer}: {kind}: {exc}"
