"""The host tier's recorded block accesses per engine, read from the stored span events."""

import json
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from kvscope.traces import names

_KINDS = {
    names.EVENT_BLOCK_LOOKED_UP: "lookup",
    names.EVENT_BLOCK_STORED: "store",
    names.EVENT_BLOCK_EVICTED: "evict",
    names.EVENT_LEASE_EXPIRED: "expire",
}
# Lookups, stores, evictions and expired leases are span events; a bypassed lookup is only its
# span's attribute. The range on start_ns is the span table's time key.
_SPANS = text(
    "SELECT engine_id, request_id, start_ns, attributes, events FROM span "
    "WHERE start_ns >= :since AND start_ns < :until AND engine_id IS NOT NULL "
    "AND (events LIKE '%kvscope.block.%' OR events LIKE '%kvscope.lease.expired%' "
    "OR attributes LIKE '%kvscope.lookup.skipped%')"
)


@dataclass(frozen=True)
class Access:
    """One recorded access of an engine's host pool: a lookup (the keys it asked past the local
    hit, their content hashes, how many it hit), a lookup that asked no tier ('skipped'), a
    store or an eviction of keys, or a lease that expired (the keys it held)."""

    engine_id: str
    time_ns: int
    kind: str
    req_id: str | None
    keys: tuple[str, ...] = ()
    contents: tuple[str, ...] = ()
    hit_blocks: int = 0
    block_size: int = 0
    start_block: int = 0  # a lookup's first block in the prompt (its local hit's come before)
    first_miss_state: str | None = None
    outcome: str | None = None


def read_accesses(connection: Connection, since_ns: int, until_ns: int) -> list[Access]:
    """Every engine's accesses of spans that started in [since_ns, until_ns), in time order."""
    found: list[Access] = []
    for engine_id, request_id, start_ns, attributes_json, events_json in connection.execute(
        _SPANS, {"since": since_ns, "until": until_ns}
    ):
        attributes = _json(attributes_json, {})
        if isinstance(attributes.get(names.LOOKUP_SKIPPED), str):
            found.append(Access(engine_id, int(start_ns), "skipped", _str(request_id)))
        for event in _json(events_json, []):
            access = _access(engine_id, request_id, attributes, event)
            if access is not None:
                found.append(access)
    found.sort(key=lambda access: access.time_ns)
    return found


def _access(engine_id: str, request_id, span_attributes: dict, event: dict) -> Access | None:
    kind = _KINDS.get(event.get("name", ""))
    attributes = event.get("attributes") or {}
    if kind is None or attributes.get(names.BLOCK_TIER, "host") != "host":
        return None
    keys = tuple(str(key) for key in attributes.get(names.BLOCK_HASHES) or ())
    holder = attributes.get(names.REQUEST_ID) or attributes.get(names.LEASE_HOLDER) or request_id
    access = Access(engine_id, int(event["time_ns"]), kind, _str(holder), keys)
    if kind == "lookup":
        block_size = int(attributes.get(names.BLOCK_SIZE) or 0)
        hit_tokens = int(span_attributes.get(names.TOKENS_EXTERNAL_HIT) or 0)
        local_tokens = int(span_attributes.get(names.TOKENS_LOCAL_HIT) or 0)
        contents = tuple(str(c) for c in attributes.get(names.BLOCK_CONTENT_HASHES) or ())
        return Access(
            engine_id,
            access.time_ns,
            kind,
            access.req_id,
            keys,
            contents if len(contents) == len(keys) else (),
            hit_tokens // block_size if block_size else 0,
            block_size,
            local_tokens // block_size if block_size else 0,
            _str(attributes.get(names.LOOKUP_FIRST_MISS_STATE)),
        )
    if kind == "expire":
        outcome = _str(attributes.get(names.FAILURE_OUTCOME))
        return Access(engine_id, access.time_ns, kind, access.req_id, keys, outcome=outcome)
    return access if keys else None


def _str(value) -> str | None:
    return None if value is None else str(value)


def _json(value: str | None, default):
    try:
        found = json.loads(value or "null")
    except ValueError:
        return default
    return found if isinstance(found, type(default)) else default
