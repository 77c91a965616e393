"""What one engine's KV-event stream claims it holds, per tier, and which batches never arrived."""

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the backend imports vLLM only when it subscribes (subscriber.py)
    from vllm.distributed.kv_events import KVEventBatch

MAX_GAPS_KEPT = 100
"""Newest sequence gaps listed per stream; the count covers all of them."""
TIER_OF_MEDIUM = {"CPU": "host", "GPU": "device"}
"""vLLM's medium names -> the tiers the connectors' spans name."""


@dataclass(frozen=True)
class SeqGap:
    """Batches first_seq..last_seq were published and never received (or a restart, 'why')."""

    first_seq: int
    last_seq: int
    why: str

    @property
    def missed(self) -> int:
        return self.last_seq - self.first_seq + 1


@dataclass
class StreamState:
    """One publisher (engine): block hashes claimed per tier and KV cache group, and its seqs."""

    endpoint: str
    engine_id: str | None
    claimed: dict[tuple[str, int], set] = field(default_factory=dict)
    last_seq: int | None = None
    batches: int = 0
    events: int = 0
    missed_batches: int = 0
    restarts: int = 0
    gaps: list[SeqGap] = field(default_factory=list)
    undecodable: int = 0


class EventLedger:
    """Every stream's state; written by the subscriber thread, read by the routes (locked)."""

    def __init__(self, endpoints: dict[str, str | None]) -> None:
        self._lock = threading.Lock()
        self._streams = {url: StreamState(url, engine) for url, engine in endpoints.items()}

    def record(self, endpoint: str, seq: int, batch: "KVEventBatch") -> None:
        with self._lock:
            stream = self._streams[endpoint]
            self._sequence(stream, seq)
            stream.batches += 1
            stream.events += len(batch.events)
            for event in batch.events:
                _apply(stream, event)

    def undecodable(self, endpoint: str) -> None:
        with self._lock:
            self._streams[endpoint].undecodable += 1

    def snapshot(self) -> list[StreamState]:
        """Copies of every stream's state, safe to read while events keep arriving."""
        with self._lock:
            return [_copy(stream) for stream in self._streams.values()]

    @staticmethod
    def _sequence(stream: StreamState, seq: int) -> None:
        last = stream.last_seq
        if last is None and seq > 0:
            _gap(stream, SeqGap(0, seq - 1, "published before the subscriber connected"))
        elif last is not None and seq > last + 1:
            _gap(stream, SeqGap(last + 1, seq - 1, "not received"))
        elif last is not None and seq <= last:
            # A publisher restarted (its seqs begin again): the blocks it announced are gone.
            stream.restarts += 1
            stream.claimed.clear()
            if seq > 0:
                _gap(stream, SeqGap(0, seq - 1, "published after a restart, not received"))
        stream.last_seq = seq


def _gap(stream: StreamState, gap: SeqGap) -> None:
    stream.missed_batches += gap.missed
    stream.gaps = [*stream.gaps, gap][-MAX_GAPS_KEPT:]


def _apply(stream: StreamState, event) -> None:
    kind = type(event).__name__
    if kind == "AllBlocksCleared":
        # vLLM's GPU block pool publishes it on a prefix-cache reset; other tiers keep theirs.
        for key in [key for key in stream.claimed if key[0] == "device"]:
            del stream.claimed[key]
        return
    if kind not in ("BlockStored", "BlockRemoved"):
        return
    tier = TIER_OF_MEDIUM.get(event.medium or "GPU", str(event.medium).lower())
    held = stream.claimed.setdefault((tier, event.group_idx or 0), set())
    if kind == "BlockStored":
        held.update(event.block_hashes)
    else:
        held.difference_update(event.block_hashes)


def _copy(stream: StreamState) -> StreamState:
    claimed = {key: set(hashes) for key, hashes in stream.claimed.items()}
    return StreamState(
        stream.endpoint,
        stream.engine_id,
        claimed,
        stream.last_seq,
        stream.batches,
        stream.events,
        stream.missed_batches,
        stream.restarts,
        list(stream.gaps),
        stream.undecodable,
    )
