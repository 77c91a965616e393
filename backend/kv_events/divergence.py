"""What each engine's KV events claim per tier against what its connectors' spans say it holds.

The host tier's spans name blocks by the offload pool's namespaced keys, its KV events by vLLM's
own block hashes (one key derives from one hash through a keyed digest the backend never sees),
so the two are compared by count per tier and KV cache group: `only_in_events` blocks are
claimed by events beyond what spans hold, `only_in_spans` the other way. vLLM's own GPU prefix
cache (tier 'device', medium GPU) is in the events only: spans never track it.
"""

from pydantic import BaseModel
from sqlalchemy import Connection, text

from kvscope.backend.kv_events.ledger import StreamState

HELD_STATES = ("stored", "loaded")
"""Block states in which a slot holds its block (a loaded host block stays in the pool)."""
_HELD = text(
    "SELECT engine_id, tier, COALESCE(kv_group, 0), COUNT(*) FROM block "
    "WHERE state IN ('stored', 'loaded') GROUP BY engine_id, tier, COALESCE(kv_group, 0)"
)
SPAN_TIERS = ("host",)
"""Tiers whose holdings the connectors' spans record."""


class TierDivergence(BaseModel):
    tier: str
    kv_group: int
    claimed: int
    """Blocks the events say the tier holds (stored and not removed since)."""
    held_by_spans: int | None
    """Blocks the spans say it holds; None where spans do not track the tier."""
    only_in_events: int | None
    only_in_spans: int | None


class SeqGapPublic(BaseModel):
    first_seq: int
    last_seq: int
    missed: int
    why: str


class EngineDivergence(BaseModel):
    endpoint: str
    engine_id: str | None
    """The engine the stream belongs to; None: not named and not the only one with blocks."""
    engine_named_by: str
    tiers: list[TierDivergence]
    last_seq: int | None
    batches: int
    events: int
    missed_batches: int
    restarts: int
    seq_gaps: list[SeqGapPublic]
    undecodable: int
    divergent: bool
    """Any tier's counts differ, or a batch was missed (then the events' view is incomplete)."""


class KVEventsDivergence(BaseModel):
    enabled: bool
    """False: KVSCOPE_KV_EVENTS is not set, the backend subscribes to nothing."""
    running: bool
    engines: list[EngineDivergence]


def divergence(
    connection: Connection, streams: list[StreamState], running: bool
) -> KVEventsDivergence:
    held: dict[str, dict[tuple[str, int], int]] = {}
    for engine_id, tier, group, count in connection.execute(_HELD).all():
        held.setdefault(engine_id, {})[(tier, int(group))] = int(count)
    engines = [_engine(stream, held, len(streams)) for stream in streams]
    return KVEventsDivergence(enabled=True, running=running, engines=engines)


def disabled() -> KVEventsDivergence:
    return KVEventsDivergence(enabled=False, running=False, engines=[])


def _engine(stream: StreamState, held: dict, streams: int) -> EngineDivergence:
    engine_id, named_by = stream.engine_id, "KVSCOPE_KV_EVENTS"
    with_host = [engine for engine, tiers in held.items() if any(t == "host" for t, _ in tiers)]
    if engine_id is None and streams == 1 and len(with_host) == 1:
        engine_id, named_by = with_host[0], "the only engine whose spans hold host blocks"
    elif engine_id is None:
        named_by = "unknown: name it as ENGINE_ID=tcp://HOST:PORT in KVSCOPE_KV_EVENTS"
    spans = held.get(engine_id, {}) if engine_id is not None else {}
    keys = set(stream.claimed) | {key for key in spans if key[0] in SPAN_TIERS}
    tiers = [_tier(key, len(stream.claimed.get(key, ())), spans, engine_id) for key in keys]
    tiers.sort(key=lambda t: (t.tier, t.kv_group))
    differs = any(t.only_in_events or t.only_in_spans for t in tiers)
    return EngineDivergence(
        endpoint=stream.endpoint,
        engine_id=engine_id,
        engine_named_by=named_by,
        tiers=tiers,
        last_seq=stream.last_seq,
        batches=stream.batches,
        events=stream.events,
        missed_batches=stream.missed_batches,
        restarts=stream.restarts,
        seq_gaps=[SeqGapPublic(**vars(gap), missed=gap.missed) for gap in stream.gaps],
        undecodable=stream.undecodable,
        divergent=differs or stream.missed_batches > 0,
    )


def _tier(key: tuple[str, int], claimed: int, spans: dict, engine_id) -> TierDivergence:
    tier, group = key
    if tier not in SPAN_TIERS or engine_id is None:
        return TierDivergence(
            tier=tier,
            kv_group=group,
            claimed=claimed,
            held_by_spans=None,
            only_in_events=None,
            only_in_spans=None,
        )
    held = spans.get(key, 0)
    return TierDivergence(
        tier=tier,
        kv_group=group,
        claimed=claimed,
        held_by_spans=held,
        only_in_events=max(0, claimed - held),
        only_in_spans=max(0, held - claimed),
    )
