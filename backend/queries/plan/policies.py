"""Eviction policies a replayed host pool can use: the pool's own LRU with pins, 2Q, S3-FIFO."""

from collections import OrderedDict
from typing import Protocol

from kvscope.backend.queries.plan.s3fifo import S3FIFO


class Policy(Protocol):
    """A pool of `capacity` blocks by key; pinned blocks (leased to a load) are never evicted."""

    capacity: int
    evicted: int

    def __contains__(self, key: str) -> bool: ...

    def hit(self, key: str) -> None:
        """A lookup found the key."""

    def insert(self, key: str) -> bool:
        """Stores the key, evicting as needed; False when nothing could be evicted."""

    def pin(self, key: str) -> None: ...

    def unpin(self, key: str) -> None: ...


class PoolLRU:
    """The host pool's own policy (connector/cpu_offload/host_pool.py): least recently used
    first among committed, unpinned blocks; a lookup hit moves a block to the recent end, a
    pinned block leaves the order and comes back most recent when its last pin goes."""

    name = "lru"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.evicted = 0
        self._order: OrderedDict[str, None] = OrderedDict()  # unpinned, oldest use first
        self._pins: dict[str, int] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._order or key in self._pins

    def __len__(self) -> int:
        return len(self._order) + len(self._pins)

    def hit(self, key: str) -> None:
        if key in self._order:
            self._order.move_to_end(key)

    def insert(self, key: str) -> bool:
        if key in self:
            return True
        if len(self) >= self.capacity:
            if not self._order:
                return False
            self._order.popitem(last=False)
            self.evicted += 1
        self._order[key] = None
        return True

    def pin(self, key: str) -> None:
        self._order.pop(key, None)
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: str) -> None:
        pins = self._pins.get(key, 0) - 1
        if pins > 0:
            self._pins[key] = pins
        elif key in self._pins:
            del self._pins[key]
            self._order[key] = None


class TwoQ:
    """Scan-resistant 2Q (Johnson and Shasha, 1994): a new block enters a FIFO (a quarter of
    the pool); a block asked for again after it left the FIFO (its key kept in a ghost list of
    half the pool's size) enters the main LRU. A scan of blocks used once only cycles the FIFO
    and leaves the blocks used twice alone. Pinned blocks are skipped when evicting."""

    name = "2q"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.evicted = 0
        self._fifo_size = max(1, capacity // 4)
        self._ghost_size = max(1, capacity // 2)
        self._fifo: OrderedDict[str, None] = OrderedDict()
        self._main: OrderedDict[str, None] = OrderedDict()
        self._ghost: OrderedDict[str, None] = OrderedDict()
        self._pins: dict[str, int] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._fifo or key in self._main

    def __len__(self) -> int:
        return len(self._fifo) + len(self._main)

    def hit(self, key: str) -> None:
        if key in self._main:
            self._main.move_to_end(key)

    def insert(self, key: str) -> bool:
        if key in self:
            return True
        if len(self) >= self.capacity and not self._evict_one():
            return False
        if key in self._ghost:
            del self._ghost[key]
            self._main[key] = None
        else:
            self._fifo[key] = None
        return True

    def pin(self, key: str) -> None:
        self._pins[key] = self._pins.get(key, 0) + 1

    def unpin(self, key: str) -> None:
        pins = self._pins.get(key, 0) - 1
        if pins > 0:
            self._pins[key] = pins
        else:
            self._pins.pop(key, None)

    def _evict_one(self) -> bool:
        from_fifo = len(self._fifo) > self._fifo_size or not self._main
        for queue in (self._fifo, self._main) if from_fifo else (self._main, self._fifo):
            victim = next((key for key in queue if key not in self._pins), None)
            if victim is not None:
                del queue[victim]
                self.evicted += 1
                if queue is self._fifo:
                    self._ghost[victim] = None
                    while len(self._ghost) > self._ghost_size:
                        self._ghost.popitem(last=False)
                return True
        return False


POLICIES: dict[str, type] = {"lru": PoolLRU, "2q": TwoQ, "s3fifo": S3FIFO}
"""The policies by name; 'lru' is the pool's own."""
