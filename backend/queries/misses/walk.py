"""Walks one engine's host-pool accesses in time order: why each lookup's missed blocks missed,
and what became of the blocks stored (hit, or evicted unread)."""

from dataclasses import dataclass, field
from typing import overload

from kvscope.backend.queries.misses import vocabulary as why
from kvscope.backend.queries.misses.history import Access
from kvscope.traces.outcomes import RELEASED


@dataclass
class _Stored:
    stored_ns: int
    last_access_ns: int
    stored_index: int  # the engine's blocks stored before this one: reuse distance
    hits: int = 0


@dataclass(frozen=True)
class MissRun:
    """Consecutive missed blocks of one lookup with one reason."""

    reason: str
    first_block: int  # index in the prompt
    blocks: int
    evicted_ns: int | None = None
    diverged_at_block: int | None = None


@dataclass(frozen=True)
class LookedUp:
    """One lookup of the host pool: the blocks past the local hit, those hit, why the rest
    missed."""

    time_ns: int
    req_id: str | None
    block_size: int
    asked_blocks: int
    hit_blocks: int
    runs: tuple[MissRun, ...]


@dataclass
class TierStats:
    """What the engine's host tier did with the accesses counted (from count_from_ns on)."""

    stored_blocks: int = 0
    hit_blocks: int = 0
    asked_blocks: int = 0
    lookups: int = 0
    evicted_blocks: int = 0
    evicted_unread: int = 0
    evicted_unknown: int = 0  # evicted blocks stored before the history read
    idle_before_evict_s: list[float] = field(default_factory=list)
    reuse_gap_s: list[float] = field(default_factory=list)
    reuse_distance_blocks: list[int] = field(default_factory=list)


class EngineWalk:
    """One engine's host pool rebuilt from its accesses. Feed them in time order; lookups at or
    after count_from_ns are kept (lookups) and every access then is counted (stats)."""

    def __init__(self, count_from_ns: int = 0) -> None:
        self.count_from_ns = count_from_ns
        self.block_size = 0
        self.lookups: dict[str, list[LookedUp]] = {}
        self.skipped: dict[str, list[int]] = {}
        self.stats = TierStats()
        self._present: dict[str, _Stored] = {}
        self._evicted: dict[str, int] = {}
        self._stored_count = 0
        self._content_of: dict[str, tuple[str, int]] = {}  # block hash -> (content, asked)
        self._stored_content: dict[str, set[str]] = {}  # content hash -> block hashes stored
        self._expired: dict[str, list[tuple[int, frozenset[str]]]] = {}  # released leases

    def feed(self, access: Access) -> None:
        counted = access.time_ns >= self.count_from_ns
        if access.kind == "lookup":
            self._lookup(access, counted)
        elif access.kind == "store":
            self._store(access, counted)
        elif access.kind == "evict":
            self._evict(access, counted)
        elif access.kind == "expire" and access.outcome == RELEASED and access.req_id:
            self._expired.setdefault(access.req_id, []).append(
                (access.time_ns, frozenset(access.keys))
            )
        elif access.kind == "skipped" and counted and access.req_id:
            self.skipped.setdefault(access.req_id, []).append(access.time_ns)

    def forget(self, before_ns: int) -> None:
        """Drops what only a lookup before before_ns could use: kept lookups, evictions and
        asked contents older (a walk fed for days stays the size of its pool and an hour)."""
        for req_id in [r for r, found in self.lookups.items() if found[-1].time_ns < before_ns]:
            del self.lookups[req_id]
        for req_id in [r for r, times in self.skipped.items() if times[-1] < before_ns]:
            del self.skipped[req_id]
        for req_id in [r for r, found in self._expired.items() if found[-1][0] < before_ns]:
            del self._expired[req_id]
        for key in [k for k, evicted_ns in self._evicted.items() if evicted_ns < before_ns]:
            del self._evicted[key]
            if (stored := self._content_of.get(key)) is not None:
                self._stored_content.get(stored[0], set()).discard(key)
        for key, (content, asked_ns) in list(self._content_of.items()):
            if asked_ns < before_ns and key not in self._present and key not in self._evicted:
                del self._content_of[key]
                keys = self._stored_content.get(content)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del self._stored_content[content]

    def _store(self, access: Access, counted: bool) -> None:
        for key in access.keys:
            if key in self._present:
                continue
            self._present[key] = _Stored(access.time_ns, access.time_ns, self._stored_count)
            self._stored_count += 1
            self._evicted.pop(key, None)
            if (content := self._content_of.get(key)) is not None:
                self._stored_content.setdefault(content[0], set()).add(key)
            if counted:
                self.stats.stored_blocks += 1

    def _evict(self, access: Access, counted: bool) -> None:
        for key in access.keys:
            stored = self._present.pop(key, None)
            self._evicted[key] = access.time_ns
            if not counted:
                continue
            self.stats.evicted_blocks += 1
            if stored is None:
                self.stats.evicted_unknown += 1
                continue
            self.stats.evicted_unread += stored.hits == 0
            self.stats.idle_before_evict_s.append((access.time_ns - stored.last_access_ns) / 1e9)

    def _lookup(self, access: Access, counted: bool) -> None:
        self.block_size = access.block_size or self.block_size
        for key, content in zip(access.keys, access.contents, strict=False):
            self._content_of[key] = (content, access.time_ns)
            if key in self._present:
                self._stored_content.setdefault(content, set()).add(key)
        hit = min(access.hit_blocks, len(access.keys))
        for key in access.keys[:hit]:
            self._hit(key, access.time_ns, counted)
        if not counted or access.req_id is None:
            return
        self.stats.lookups += 1
        self.stats.asked_blocks += len(access.keys)
        self.stats.hit_blocks += hit
        self.lookups.setdefault(access.req_id, []).append(
            LookedUp(
                access.time_ns,
                access.req_id,
                access.block_size,
                len(access.keys),
                hit,
                tuple(self._runs(access, hit)),
            )
        )

    def _hit(self, key: str, now_ns: int, counted: bool) -> None:
        stored = self._present.get(key)
        if stored is None:
            return
        if counted:
            self.stats.reuse_gap_s.append((now_ns - stored.last_access_ns) / 1e9)
            if stored.hits == 0:
                self.stats.reuse_distance_blocks.append(self._stored_count - stored.stored_index)
        stored.hits += 1
        stored.last_access_ns = now_ns

    def _runs(self, access: Access, hit: int) -> list[MissRun]:
        """The missed blocks' reasons, merged into runs. A block behind the first miss that
        the pool still holds missed for the first miss's reason (a hit is a prefix)."""
        runs: list[MissRun] = []
        for offset, key in enumerate(access.keys[hit:]):
            index = access.start_block + hit + offset
            content = access.contents[hit + offset] if access.contents else None
            previous = runs[-1] if runs else None
            run = self._reason(access, key, content, index, previous, first=offset == 0)
            if previous is not None and _same(previous, run):
                runs[-1] = MissRun(
                    previous.reason,
                    previous.first_block,
                    previous.blocks + 1,
                    previous.evicted_ns,
                    previous.diverged_at_block,
                )
            else:
                runs.append(run)
        return runs

    def _reason(
        self,
        access: Access,
        key: str,
        content: str | None,
        index: int,
        previous: MissRun | None,
        first: bool,
    ) -> MissRun:
        if first and access.first_miss_state == "writing":
            return MissRun(why.IN_FLIGHT, index, 1)
        if key in self._present:  # behind an earlier miss, or committed while it was asked
            return _continued(previous, index) or MissRun(why.IN_FLIGHT, index, 1)
        if (evicted_ns := self._evicted.get(key)) is not None:
            if self._lease_expired(access.req_id, key, evicted_ns):
                return MissRun(why.LEASE_EXPIRED, index, 1, evicted_ns)
            return MissRun(why.EVICTED, index, 1, evicted_ns)
        if content is not None and self._stored_content.get(content, set()) - {key}:
            return MissRun(why.OTHER_KEY, index, 1)
        if previous is not None and previous.reason in (why.FIRST_SIGHT, why.DIVERGED):
            return _continued(previous, index)
        if index == 0:
            return MissRun(why.FIRST_SIGHT, index, 1)
        return MissRun(why.DIVERGED, index, 1, diverged_at_block=index)

    def _lease_expired(self, req_id: str | None, key: str, evicted_ns: int) -> bool:
        return any(
            expired_ns <= evicted_ns and key in keys
            for expired_ns, keys in self._expired.get(req_id or "", ())
        )


@overload
def _continued(previous: MissRun, index: int) -> MissRun: ...
@overload
def _continued(previous: MissRun | None, index: int) -> MissRun | None: ...
def _continued(previous: MissRun | None, index: int) -> MissRun | None:
    if previous is None:
        return None
    return MissRun(previous.reason, index, 1, previous.evicted_ns, previous.diverged_at_block)


def _same(run: MissRun, block: MissRun) -> bool:
    """Whether the block extends the run: one reason (and, when evicted, about one eviction)."""
    return (
        run.reason == block.reason
        and run.diverged_at_block == block.diverged_at_block
        and (run.evicted_ns is None) == (block.evicted_ns is None)
    )
