"""S3-FIFO (Yang et al., SOSP 2023) for the replayed pool: a small FIFO, a main FIFO, a ghost."""

from collections import OrderedDict

MAX_FREQ = 3
"""The two-bit access counter's cap."""


class S3FIFO:
    """A new block enters the small FIFO (a tenth of the pool), or the main FIFO when its key is
    in the ghost FIFO (keys evicted from the small one, as many as the main one holds). A hit
    only counts (up to 3). The small FIFO's oldest block moves to the main one if it was hit
    since it came in, else it leaves and its key goes to the ghost; the main FIFO's oldest goes
    back in with its count less one while the count is above 0 (a two-bit CLOCK). Blocks used
    once so leave after a tenth of the pool's inserts and never reach the main FIFO: a scan
    does not flush the blocks used twice. Pinned blocks are skipped when evicting."""

    name = "s3fifo"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.evicted = 0
        self._small_size = max(1, capacity // 10)
        self._ghost_size = max(1, capacity - self._small_size)
        self._small: OrderedDict[str, int] = OrderedDict()  # key -> hits since it came in
        self._main: OrderedDict[str, int] = OrderedDict()
        self._ghost: OrderedDict[str, None] = OrderedDict()
        self._pins: dict[str, int] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._small or key in self._main

    def __len__(self) -> int:
        return len(self._small) + len(self._main)

    def hit(self, key: str) -> None:
        for queue in (self._small, self._main):
            if key in queue:
                queue[key] = min(MAX_FREQ, queue[key] + 1)

    def insert(self, key: str) -> bool:
        if key in self:
            return True
        if len(self) >= self.capacity and not self._evict_one():
            return False
        if key in self._ghost:
            del self._ghost[key]
            self._main[key] = 0
        else:
            self._small[key] = 0
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
        if (len(self._small) >= self._small_size or not self._main) and self._evict_small():
            return True
        return self._evict_main()

    def _evict_small(self) -> bool:
        """The oldest unpinned block hit since it came in moves to the main FIFO; the first
        never hit leaves, its key kept in the ghost FIFO."""
        while (key := self._oldest_unpinned(self._small)) is not None:
            if self._small.pop(key) > 0:
                self._main[key] = 0
                continue
            self.evicted += 1
            self._ghost[key] = None
            while len(self._ghost) > self._ghost_size:
                self._ghost.popitem(last=False)
            return True
        return False

    def _evict_main(self) -> bool:
        """Two-bit CLOCK: the oldest unpinned block leaves if its count is 0, else goes back
        in with its count less one (so this ends within MAX_FREQ + 1 turns of the queue)."""
        while (key := self._oldest_unpinned(self._main)) is not None:
            if self._main[key] == 0:
                del self._main[key]
                self.evicted += 1
                return True
            self._main[key] -= 1
            self._main.move_to_end(key)
        return False

    def _oldest_unpinned(self, queue: OrderedDict[str, int]) -> str | None:
        """Reads past the pinned blocks only (a few: those leased or being written)."""
        return next((key for key in queue if key not in self._pins), None)
