"""Host block pool: which host block holds which KV block key, with reserve/commit and LRU."""

import hashlib
import heapq
import json
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import cached_property


@dataclass(frozen=True)
class KVNamespace:
    """Everything that makes KV from two engines incompatible; mixed into every block key."""

    model: str
    dtype: str
    kv_layout: str
    block_size: int
    tp_rank: int
    tp_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @cached_property
    def digest(self) -> bytes:
        canonical = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(canonical).digest()[:16]

    def block_key(self, block_hash: bytes) -> bytes:
        """The pool key for one block: its content hash keyed by this namespace."""
        if not isinstance(block_hash, bytes | bytearray):
            raise TypeError(f"block_hash must be bytes, got {type(block_hash).__name__}")
        return hashlib.blake2b(bytes(block_hash), digest_size=32, key=self.digest).digest()

    def block_keys(self, block_hashes: list[bytes]) -> list[bytes]:
        return [self.block_key(block_hash) for block_hash in block_hashes]


def num_host_blocks(cpu_bytes_to_use: int, bytes_per_block: int) -> int:
    """How many whole blocks (all layers each) fit in the host byte budget."""
    if bytes_per_block <= 0:
        raise ValueError(f"bytes_per_block must be positive, got {bytes_per_block}")
    return max(0, int(cpu_bytes_to_use) // bytes_per_block)


class BlockState(Enum):
    FREE = "free"
    RESERVED = "reserved"  # being written: invisible to lookups, not evictable
    COMMITTED = "committed"


@dataclass
class Reservation:
    """Host blocks handed to one store; commit them after the copy, abort them on failure."""

    block_keys: list[bytes] = field(default_factory=list)
    host_block_ids: list[int] = field(default_factory=list)
    already_present: list[bytes] = field(default_factory=list)
    evicted_keys: list[bytes] = field(default_factory=list)
    evicted_host_block_ids: list[int] = field(default_factory=list)  # parallel to evicted_keys
    refused: int = 0  # keys that got no host block because none was free or evictable


@dataclass
class PoolStats:
    """Counters since start, plus gauges filled in by HostBlockPool.stats()."""

    lookups: int = 0
    hit_blocks: int = 0
    reserved_blocks: int = 0
    committed_blocks: int = 0
    aborted_blocks: int = 0
    evicted_blocks: int = 0
    store_refused_blocks: int = 0
    eviction_refused: int = 0
    num_blocks: int = 0
    free: int = 0
    reserved: int = 0
    committed: int = 0
    pinned: int = 0


class HostBlockPool:
    """Index of a fixed number of host blocks; knows keys and states, never touches bytes.

    It lives with the scheduler (one thread), while the bytes live in the worker's HostBuffer:
    the two share only host block ids. Not thread-safe.
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {num_blocks}")
        self.num_blocks: int = num_blocks
        # A heap hands out the lowest free ids first, so one store tends to get a contiguous run.
        self._free_ids: list[int] = list(range(num_blocks))
        self._states: list[BlockState] = [BlockState.FREE] * num_blocks
        self._keys: list[bytes | None] = [None] * num_blocks
        self._host_block_of: dict[bytes, int] = {}
        self._pins: list[int] = [0] * num_blocks
        # Committed, unpinned blocks only; oldest use first.
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._counters: PoolStats = PoolStats()

    # Lookups

    def lookup(self, block_keys: list[bytes]) -> list[int]:
        """Host block ids of the longest prefix of keys that are committed (stops at a hole)."""
        self._counters.lookups += 1
        host_block_ids: list[int] = []
        for block_key in block_keys:
            host_block_id = self._host_block_of.get(block_key)
            if host_block_id is None or self._states[host_block_id] is not BlockState.COMMITTED:
                break
            host_block_ids.append(host_block_id)
            if host_block_id in self._lru:
                self._lru.move_to_end(host_block_id)
        self._counters.hit_blocks += len(host_block_ids)
        return host_block_ids

    def state_of(self, block_key: bytes) -> BlockState:
        host_block_id = self._host_block_of.get(block_key)
        return BlockState.FREE if host_block_id is None else self._states[host_block_id]

    def key_of(self, host_block_id: int) -> bytes | None:
        return self._keys[host_block_id]

    def is_pinned(self, host_block_id: int) -> bool:
        return self._pins[host_block_id] > 0

    # Stores

    def reserve(self, block_keys: list[bytes]) -> Reservation:
        """Take host blocks for the keys not yet present, in order, evicting LRU blocks if needed.

        Stops at the first key that gets no block: a later block without its predecessors
        could never be hit, because lookups stop at the first hole.
        """
        reservation = Reservation()
        for index, block_key in enumerate(block_keys):
            if block_key in self._host_block_of:
                reservation.already_present.append(block_key)
                continue
            host_block_id = self._take_block(reservation)
            if host_block_id is None:
                missing = [k for k in block_keys[index:] if k not in self._host_block_of]
                reservation.refused = len(missing)
                break
            self._states[host_block_id] = BlockState.RESERVED
            self._keys[host_block_id] = block_key
            self._host_block_of[block_key] = host_block_id
            reservation.block_keys.append(block_key)
            reservation.host_block_ids.append(host_block_id)
        self._counters.reserved_blocks += len(reservation.host_block_ids)
        self._counters.store_refused_blocks += reservation.refused
        return reservation

    def commit(self, host_block_ids: list[int]) -> None:
        """Make reserved blocks visible to lookups: their bytes are now on the host."""
        self._require_state(host_block_ids, BlockState.RESERVED, "commit")
        for host_block_id in host_block_ids:
            self._states[host_block_id] = BlockState.COMMITTED
            self._lru[host_block_id] = None
        self._counters.committed_blocks += len(host_block_ids)

    def abort(self, host_block_ids: list[int]) -> None:
        """Return reserved blocks whose copy failed; their keys stay absent."""
        self._require_state(host_block_ids, BlockState.RESERVED, "abort")
        for host_block_id in host_block_ids:
            self._free(host_block_id)
        self._counters.aborted_blocks += len(host_block_ids)

    # Pins (held by leases) and eviction

    def pin(self, host_block_ids: list[int]) -> None:
        self._require_state(host_block_ids, BlockState.COMMITTED, "pin")
        for host_block_id in host_block_ids:
            self._pins[host_block_id] += 1
            self._lru.pop(host_block_id, None)

    def unpin(self, host_block_ids: list[int]) -> None:
        for host_block_id in host_block_ids:
            if self._pins[host_block_id] <= 0:
                raise ValueError(f"host block {host_block_id} is not pinned")
            self._pins[host_block_id] -= 1
            if self._pins[host_block_id] == 0:
                self._lru[host_block_id] = None  # most recently used: it was just read

    def evict(self, block_key: bytes) -> bool:
        """Drop one key now. Refused (and counted) while it is leased or being written."""
        host_block_id = self._host_block_of.get(block_key)
        if host_block_id is None:
            return False
        if self._pins[host_block_id] > 0 or self._states[host_block_id] is BlockState.RESERVED:
            self._counters.eviction_refused += 1
            return False
        self._lru.pop(host_block_id, None)
        self._free(host_block_id)
        self._counters.evicted_blocks += 1
        return True

    def evict_committed(self) -> list[bytes]:
        """Drops every committed, unpinned block (a cache reset); the keys it dropped."""
        keys = [key for key in self._keys if key is not None]
        return [
            key for key in keys if self.state_of(key) is BlockState.COMMITTED and self.evict(key)
        ]

    @property
    def eviction_refused(self) -> int:
        return self._counters.eviction_refused

    def stats(self) -> PoolStats:
        snapshot = PoolStats(**asdict(self._counters))
        snapshot.num_blocks = self.num_blocks
        snapshot.free = len(self._free_ids)
        snapshot.reserved = self._states.count(BlockState.RESERVED)
        snapshot.committed = self._states.count(BlockState.COMMITTED)
        snapshot.pinned = sum(1 for pins in self._pins if pins > 0)
        return snapshot

    # Helpers

    def _take_block(self, reservation: Reservation) -> int | None:
        if self._free_ids:
            return heapq.heappop(self._free_ids)
        if not self._lru:
            return None
        host_block_id, _ = self._lru.popitem(last=False)
        reservation.evicted_keys.append(self._keys[host_block_id])
        reservation.evicted_host_block_ids.append(host_block_id)
        self._forget(host_block_id)
        self._counters.evicted_blocks += 1
        return host_block_id

    def _forget(self, host_block_id: int) -> None:
        del self._host_block_of[self._keys[host_block_id]]
        self._keys[host_block_id] = None
        self._states[host_block_id] = BlockState.FREE

    def _free(self, host_block_id: int) -> None:
        self._forget(host_block_id)
        heapq.heappush(self._free_ids, host_block_id)

    def _require_state(self, host_block_ids: list[int], state: BlockState, action: str) -> None:
        for host_block_id in host_block_ids:
            if self._states[host_block_id] is not state:
                raise ValueError(
                    f"cannot {action} host block {host_block_id}: it is "
                    f"{self._states[host_block_id].value}, expected {state.value}"
                )
