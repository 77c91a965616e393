"""The offload pool's block-access stream of each engine, read from the stored span events."""

import json
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.engine import Connection

from kvscope.traces import names

_STEP_HOOK = names.SPAN_HOOK_PREFIX + "build_connector_meta"
_KINDS = {
    names.EVENT_BLOCK_LOOKED_UP: "lookup",
    names.EVENT_BLOCK_STORED: "store",
    names.EVENT_BLOCK_EVICTED: "evict",
    names.EVENT_LEASE_ACQUIRED: "lease",
    names.EVENT_LEASE_RELEASED: "release",
    names.EVENT_LEASE_EXPIRED: "release",
}
_SPANS = text(
    "SELECT engine_id, request_id, attributes, events FROM span "
    "WHERE start_ns >= :since AND start_ns < :until AND engine_id IS NOT NULL "
    "AND (events LIKE '%kvscope.block.%' OR events LIKE '%kvscope.lease.%')"
)
_STEPS = text(
    "SELECT engine_id, attributes, start_ns FROM span WHERE name = :name "
    "AND start_ns >= :since AND start_ns < :until AND engine_id IS NOT NULL"
)


@dataclass(frozen=True)
class Access:
    """One recorded access of the pool: a lookup (the keys it asked), a step that scheduled
    the request (its blocks are reserved then), a store (the keys it committed), an eviction,
    or a lease taken or ended by request req_id."""

    time_ns: int
    kind: str
    req_id: str | None
    keys: tuple[str, ...] = ()
    hit_tokens: int = 0  # a lookup's answer as the connector measured it
    found_writing: bool = False  # a lookup whose first block not hit was still being stored


@dataclass
class EngineStream:
    """One engine's accesses in time order, with its block size and today's pool size."""

    engine_id: str
    block_size: int = 0
    pool_blocks: int = 0
    accesses: list[Access] = field(default_factory=list)

    @property
    def replayable(self) -> bool:
        """Whether its lookups said what they asked (recordings before the looked_up event
        did not), which a replay needs."""
        return self.block_size > 0 and any(a.kind == "lookup" for a in self.accesses)


def read_streams(connection: Connection, since_ns: int, until_ns: int) -> dict[str, EngineStream]:
    """Every engine's stream in [since_ns, until_ns), by engine id."""
    streams: dict[str, EngineStream] = {}
    rows = connection.execute(_SPANS, {"since": since_ns, "until": until_ns})
    for engine_id, request_id, attributes_json, events_json in rows:
        stream = streams.setdefault(engine_id, EngineStream(engine_id))
        attributes = json.loads(attributes_json or "{}")
        for event in json.loads(events_json or "[]"):
            access = _access(stream, event, attributes, request_id)
            if access is not None:
                stream.accesses.append(access)
    for engine_id, attributes_json, start_ns in connection.execute(
        _STEPS, {"name": _STEP_HOOK, "since": since_ns, "until": until_ns}
    ):
        if engine_id in streams:
            for req_id in json.loads(attributes_json or "{}").get(names.REQUEST_IDS) or ():
                streams[engine_id].accesses.append(Access(int(start_ns), "step", str(req_id)))
    for stream in streams.values():
        _in_order(stream)
    return streams


def _in_order(stream: EngineStream) -> None:
    """Time order; the requests of one step in the order they were looked up (the order vLLM
    scheduled them, in which their stores took host blocks)."""
    asked_at = {a.req_id: a.time_ns for a in stream.accesses if a.kind == "lookup"}
    stream.accesses.sort(
        key=lambda a: (a.time_ns, asked_at.get(a.req_id, 0) if a.kind == "step" else 0)
    )


def _access(stream: EngineStream, event: dict, span_attributes: dict, request_id) -> Access | None:
    kind = _KINDS.get(event.get("name", ""))
    attributes = event.get("attributes") or {}
    if kind is None or attributes.get(names.BLOCK_TIER, "host") != "host":
        return None
    keys = tuple(str(key) for key in attributes.get(names.BLOCK_HASHES) or ())
    req_id = attributes.get(names.REQUEST_ID) or attributes.get(names.LEASE_HOLDER) or request_id
    hit_tokens, found_writing = 0, False
    if kind == "lookup":
        found_writing = attributes.get(names.LOOKUP_FIRST_MISS_STATE) == "writing"
        stream.block_size = int(attributes.get(names.BLOCK_SIZE) or stream.block_size)
        stream.pool_blocks = int(attributes.get(names.HOST_POOL_BLOCKS) or stream.pool_blocks)
        hit_tokens = int(span_attributes.get(names.TOKENS_EXTERNAL_HIT) or 0)
    elif kind in ("store", "evict") and not keys:
        return None
    req_id = None if req_id is None else str(req_id)
    return Access(int(event["time_ns"]), kind, req_id, keys, hit_tokens, found_writing)
