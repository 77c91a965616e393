"""Prefill side of the worker half: blocks held for remote readers, until read or leased out."""

import logging
import time

from kvscope.connector.p2p.metadata import HeldBlocks, done_notif, req_id_of_notif
from kvscope.connector.p2p.stats import LoanCounters
from kvscope.connector.p2p.transport.nixl_transport import NixlTransport
from kvscope.connector.p2p.transport.results import PeerNotif
from kvscope.traces import names
from kvscope.traces.facts import add_event

logger = logging.getLogger(__name__)

_EARLY_NOTIF_TTL_S = 600.0


class BlockLender:
    """Turns 'read done' notifications and expired leases into finished_sending.

    The transport's poller keeps NIXL progressing (reads of our memory complete only while it
    polls) and expires the expected reads at their lease deadline: from then on the scheduler
    frees the blocks, and the decode side refuses any read it could not finish before.
    """

    def __init__(self, transport: NixlTransport) -> None:
        self.transport = transport
        self.lent: dict[str, HeldBlocks] = {}  # req_id -> blocks a reader has not read yet
        self._early: dict[str, float] = {}  # notified before the worker heard of the request
        self._finished: set[str] = set()
        self.leases_expired: set[str] = set()  # since the last take
        self.stats = LoanCounters()

    def hold(self, specs: list[HeldBlocks], registration: int = 0) -> None:
        """Keep these blocks for their readers; a lease naming an older registration than ours
        was made before the KV cache was lent away and registered again: revoked at once."""
        for spec in specs:
            if spec.registration < registration:
                self._expire(spec, "lease_expired: revoked, made before the KV cache was lent away")
                continue
            if self._early.pop(spec.req_id, None) is not None:
                self._finished.add(spec.req_id)  # the reader was faster than our metadata
                continue
            self.lent[spec.req_id] = spec
            remaining_s = max(spec.lease_deadline_unix_s - time.time(), 0.0)
            self.transport.expect_remote_read(done_notif(spec.req_id), remaining_s)

    def collect(self, notifs: list[PeerNotif], expired: list[bytes]) -> set[str]:
        """finished_sending: requests read (or released) by their reader, or whose lease ended."""
        for notif in notifs:
            req_id = req_id_of_notif(notif.message)
            if req_id is None:
                logger.warning("p2p: ignored a notification that is not ours: %r", notif.message)
            elif self.lent.pop(req_id, None) is not None:
                self.stats.reads_notified += 1
                self._finished.add(req_id)
            else:
                self._early[req_id] = time.monotonic()
        for message in expired:
            req_id = req_id_of_notif(message)
            if req_id is not None and (held := self.lent.pop(req_id, None)) is not None:
                self._expire(held)
        self._forget_old_early()
        finished, self._finished = self._finished, set()
        return finished

    def revoke_all(self, cause: str) -> None:
        """The memory of every lent block goes away: each loan ends now, as expired by `cause`."""
        for held in list(self.lent.values()):
            self._expire(held, f"lease_expired: revoked, {cause}")
        self.lent.clear()

    def _expire(
        self, held: HeldBlocks, cause: str = "lease_expired: no reader came before the deadline"
    ) -> None:
        self.stats.leases_expired += 1
        self.leases_expired.add(held.req_id)
        self._finished.add(held.req_id)
        add_event(
            names.EVENT_LEASE_EXPIRED,
            **{
                names.LEASE_HOLDER: held.req_id,
                names.REQUEST_ID: held.req_id,
                names.BLOCK_COUNT: held.num_blocks,
                names.FAILURE_CAUSE: cause,
            },
        )

    def _forget_old_early(self) -> None:
        """Notifications for requests we never held (a late reader after expiry) age out."""
        now = time.monotonic()
        for req_id, seen in list(self._early.items()):
            if now - seen > _EARLY_NOTIF_TTL_S:
                del self._early[req_id]
                self.stats.late_notifs += 1

    def held(self) -> dict[str, object]:
        """Requests whose blocks are lent to a reader that has not read them yet."""
        return {"lender_held": sorted(self.lent)}

    def take_leases_expired(self) -> set[str]:
        expired, self.leases_expired = self.leases_expired, set()
        return expired
