"""Tier alarms: a host tier written and never read, blocks dropped before reuse, and how long
blocks sit idle before eviction and between uses."""

import json

from pydantic import BaseModel, Field
from sqlalchemy import Connection, text

from kvscope.backend.queries.misses.report import HISTORY_S, walks
from kvscope.backend.queries.misses.walk import TierStats
from kvscope.traces import names

_STORES = text(
    "SELECT attributes FROM span WHERE name = 'kvscope.transfer' "
    "AND start_ns >= :since AND start_ns < :until AND (engine_id = :engine OR "
    "(engine_id IS NULL AND instance_id IN "
    "(SELECT instance_id FROM process WHERE engine_id = :engine)))"
)

MIN_BLOCKS = 32
"""Stores (or evictions) in the window before an alarm may be raised on them."""

NEVER_READ_HIT_SHARE = 0.01
"""Written, never read: blocks hit at most this share of the blocks stored."""

DROPPED_SHARE = 0.9
"""Dropped before reuse: at least this share of the blocks evicted had no hit."""


class Distribution(BaseModel):
    count: int
    p50: float | None
    p90: float | None
    max: float | None


class TierAlarms(BaseModel):
    engine_id: str
    tier: str = "host"
    lookups: int
    stored_blocks: int
    stored_bytes: int | None = Field(description="from the store transfers (None: none named)")
    hit_blocks: int
    evicted_blocks: int
    evicted_unread: int
    dropped_before_reuse: float | None = Field(description="share of evicted blocks never hit")
    idle_before_evict_s: Distribution = Field(description="last use (store or hit) to eviction")
    reuse_gap_s: Distribution = Field(description="store or previous hit to the next hit")
    reuse_distance_blocks: Distribution = Field(
        description="blocks stored between a block's store and its first hit"
    )
    written_never_read: bool
    dropped_alarm: bool
    alarms: list[str] = Field(description="each raised alarm in words")


class TierAlarmsPublic(BaseModel):
    window_s: float
    thresholds: dict[str, float] = {
        "min_blocks": MIN_BLOCKS,
        "never_read_hit_share": NEVER_READ_HIT_SHARE,
        "dropped_share": DROPPED_SHARE,
    }
    tiers: list[TierAlarms]


def tier_alarms(
    connection: Connection,
    since_ns: int,
    until_ns: int | None,
    window_s: float,
    history_s: float = HISTORY_S,
) -> TierAlarmsPublic:
    """Every engine's host tier over [since_ns, until_ns), its blocks' history read from
    history_s before (a block stored before that and evicted in the window is not judged)."""
    found = []
    for engine_id, walk in sorted(walks(connection, since_ns, until_ns, history_s).items()):
        stored_bytes = _stored_bytes(connection, engine_id, since_ns, until_ns)
        found.append(judge(engine_id, walk.stats, stored_bytes, window_s))
    return TierAlarmsPublic(window_s=window_s, tiers=found)


def judge(engine_id: str, stats: TierStats, stored_bytes: int | None, window_s: float):
    judged = stats.evicted_blocks - stats.evicted_unknown
    dropped = stats.evicted_unread / judged if judged else None
    never_read = (
        stats.stored_blocks >= MIN_BLOCKS
        and stats.hit_blocks <= NEVER_READ_HIT_SHARE * stats.stored_blocks
    )
    dropped_alarm = judged >= MIN_BLOCKS and dropped is not None and dropped >= DROPPED_SHARE
    span = _window_words(window_s)
    alarms = []
    if never_read:
        size = "" if stored_bytes is None else f" ({_bytes(stored_bytes)})"
        alarms.append(
            f"host tier of {engine_id}: {stats.stored_blocks} blocks{size} stored and "
            f"{stats.hit_blocks} hit in {span}: written, never read"
        )
    if dropped_alarm and dropped is not None:
        alarms.append(
            f"host tier of {engine_id}: {100 * dropped:.0f}% of blocks evicted unread in {span}"
        )
    return TierAlarms(
        engine_id=engine_id,
        lookups=stats.lookups,
        stored_blocks=stats.stored_blocks,
        stored_bytes=stored_bytes,
        hit_blocks=stats.hit_blocks,
        evicted_blocks=stats.evicted_blocks,
        evicted_unread=stats.evicted_unread,
        dropped_before_reuse=dropped,
        idle_before_evict_s=distribution(stats.idle_before_evict_s),
        reuse_gap_s=distribution(stats.reuse_gap_s),
        reuse_distance_blocks=distribution([float(d) for d in stats.reuse_distance_blocks]),
        written_never_read=never_read,
        dropped_alarm=dropped_alarm,
        alarms=alarms,
    )


def distribution(values: list[float]) -> Distribution:
    ordered = sorted(values)
    if not ordered:
        return Distribution(count=0, p50=None, p90=None, max=None)

    def at(share: float) -> float:
        return ordered[min(len(ordered) - 1, int(share * len(ordered)))]

    return Distribution(count=len(ordered), p50=at(0.5), p90=at(0.9), max=ordered[-1])


def _stored_bytes(
    connection: Connection, engine_id: str, since_ns: int, until_ns: int | None
) -> int | None:
    """Bytes of the engine's store transfers in the window (a worker's transfer spans may
    name no engine: its process's is read from the process table)."""
    total = None
    rows = connection.execute(
        _STORES, {"engine": engine_id, "since": since_ns, "until": until_ns or 2**63 - 1}
    )
    for (attributes_json,) in rows:
        attributes = json.loads(attributes_json or "{}")
        if attributes.get(names.TRANSFER_DIRECTION) == "store":
            total = (total or 0) + int(attributes.get(names.TRANSFER_BYTES) or 0)
    return total


def _window_words(window_s: float) -> str:
    if window_s >= 120:
        return f"the last {window_s / 60:g} min"
    return f"the last {window_s:g} s"


def _bytes(count: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"
