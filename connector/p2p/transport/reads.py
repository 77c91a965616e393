"""The transport's reads: in flight, ended but not yet released by NIXL, and their results.

A read that fails or times out is reported only once NIXL released its handle: until then the
NIC may still write into the local blocks, and vLLM would recompute into them or hand them to
another request. Like stock NIXL, such a read keeps its blocks (its request stays waiting)
until the release succeeds or the transport is closed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from kvscope.connector.p2p.transport import nixl_agent
from kvscope.connector.p2p.transport.results import (
    NixlReadFacts,
    TransferResult,
    describe_failure,
)

logger = logging.getLogger(__name__)


@dataclass
class Inflight:
    xfer_id: int
    peer: str
    handle: Any  # nixl_xfer_handle, None until posted
    num_blocks: int
    nbytes: int = 0
    descriptors: int = 0
    started: float = 0.0  # monotonic
    deadline: float = 0.0  # monotonic
    cause: str = ""  # why it failed, once it has ended
    ended: float = 0.0  # monotonic: when it was first seen over (before NIXL released it)
    nixl: NixlReadFacts | None = None  # read from NIXL while it still held the handle


class ReadBook:
    """Reads by transfer id, through posted -> ended -> released -> result."""

    def __init__(self) -> None:
        self.inflight: dict[int, Inflight] = {}
        self.releasing: dict[int, Inflight] = {}  # failed, NIXL still holds the handle
        self.results: dict[int, TransferResult] = {}
        self.unreleased: list[Any] = []  # handles of reads that completed, to release later

    @property
    def pending_release(self) -> bool:
        return bool(self.releasing or self.unreleased)

    def check(self, agent: Any, xfer: Inflight, now: float) -> bool:
        """Settle one in-flight read if it ended; True if a result was published."""
        try:
            state = agent.check_xfer_state(xfer.handle)
        except Exception as exc:
            return self.end(xfer, describe_failure(exc, xfer.peer))
        if state == "DONE":
            xfer.ended = time.monotonic()  # the same read's end, before the release's own time
            xfer.nixl = nixl_agent.read_facts(agent, xfer.handle)
            return self.end(xfer, "")
        if state != "PROC":
            return self.end(xfer, f"NIXL reported the read from peer {xfer.peer} as {state}")
        if now > xfer.deadline:
            return self.end(
                xfer,
                f"timed out after {xfer.deadline - xfer.started:.1f} s: peer {xfer.peer} is hung"
                " or not polling its agent; read from another peer or recompute",
            )
        return False

    def end(self, xfer: Inflight, cause: str) -> bool:
        """The read is over (cause empty: it succeeded); True if its result was published."""
        self.inflight.pop(xfer.xfer_id, None)
        xfer.cause = cause
        if xfer.handle is None or nixl_agent.release_quietly(xfer.handle):
            self._publish(xfer, cause)
            return True
        if not cause:  # its bytes all arrived: only the handle leaks until a retry frees it
            self.unreleased.append(xfer.handle)
            self._publish(xfer, cause)
            return True
        logger.warning(
            "p2p: read %d from %s failed (%s) but NIXL did not release it: keeping its %d"
            " blocks until it does",
            xfer.xfer_id,
            xfer.peer,
            cause,
            xfer.num_blocks,
        )
        self.releasing[xfer.xfer_id] = xfer
        return False

    def retry_releases(self) -> bool:
        """Retry NIXL releases; True if a held read's failure was published."""
        self.unreleased = [h for h in self.unreleased if not nixl_agent.release_quietly(h)]
        released = [x for x in self.releasing.values() if nixl_agent.release_quietly(x.handle)]
        for xfer in released:
            del self.releasing[xfer.xfer_id]
            self._publish(xfer, xfer.cause)
        return bool(released)

    def close(self, cause: str) -> None:
        """The agent is going away: end every read; held ones are reported now, with `cause`."""
        for xfer in list(self.inflight.values()):
            self.end(xfer, cause)
        self.retry_releases()
        for xfer in list(self.releasing.values()):
            self._publish(xfer, f"{xfer.cause}; {cause} before NIXL released the read")
        self.releasing.clear()

    def _publish(self, xfer: Inflight, cause: str) -> None:
        """Bytes and time of one window: this read's post to when it was first seen over."""
        ended = xfer.ended or time.monotonic()
        self.results[xfer.xfer_id] = TransferResult(
            xfer.xfer_id,
            xfer.peer,
            xfer.num_blocks,
            xfer.nbytes,
            ended - xfer.started if xfer.started else 0.0,
            cause,
            xfer.descriptors,
            ended,
            xfer.nixl,
        )
