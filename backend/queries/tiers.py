"""The latest health state of every KV tier (offload pool, P2P peer) per engine, from its spans.

A connector's scheduler half emits one kvscope.tier.health span when a tier changes state;
the span table is the record, and a partial index over those rare spans (migration 5) makes
reading the latest ones a short index scan. Retention applies: a tier whose last change is
older than the spans kept is not listed (unknown, not healthy).
"""

import json

from pydantic import BaseModel
from sqlalchemy import Connection, text

from kvscope.traces import names

NEWEST = 5000
"""Newest tier spans read: state changes are rare, so this covers every tier's latest state."""

# The literal name (not a bound parameter) lets SQLite read the partial index. The span
# carries no engine id where the emitter set none: its process's engine id names the engine.
_NEWEST = text(
    "SELECT COALESCE(span.engine_id, process.engine_id, span.instance_id), "
    "COALESCE(span.service_name, process.service_name), span.instance_id, span.end_ns, "
    "span.attributes FROM span LEFT JOIN process ON process.instance_id = span.instance_id "
    "WHERE span.name = 'kvscope.tier.health' ORDER BY span.end_ns DESC LIMIT :limit"
)


class TierHealth(BaseModel):
    """One tier of one engine: the state it is in and since when."""

    engine_id: str
    service_name: str | None
    instance_id: str | None
    tier: str
    state: str
    reason: str | None
    failures: int | None
    bypass_s: float | None
    since_ns: int
    """When the tier entered this state (the first of its latest run of same-state spans)."""
    updated_ns: int
    """The latest span's time."""
    bypassed_until_ns: int | None
    """For a bypassed tier: when it is probed again (latest span + its bypass_s)."""


def latest(connection: Connection) -> list[TierHealth]:
    """Every (engine, tier)'s latest state, bypassed tiers first, then by engine and tier."""
    by_engine: dict[str, list] = {}
    for row in connection.execute(_NEWEST, {"limit": NEWEST}).all():
        by_engine.setdefault(row[0] or "unknown", []).append(row)
    found = [health for rows in by_engine.values() for health in _fold(rows)]
    order = {"bypassed": 0, "probing": 1}
    return sorted(found, key=lambda t: (order.get(t.state, 2), t.engine_id, t.tier))


def _fold(rows) -> list[TierHealth]:
    """Rows newest first -> one state per tier; `since` walks back over repeats of it."""
    states: dict[str, TierHealth] = {}
    settled: set[str] = set()
    for engine_id, service_name, instance_id, end_ns, attributes_text in rows:
        attributes = _attributes(attributes_text)
        tier, state = attributes.get(names.TIER), attributes.get(names.TIER_STATE)
        if not isinstance(tier, str) or not isinstance(state, str) or tier in settled:
            continue
        known = states.get(tier)
        if known is None:
            states[tier] = _health(
                engine_id or "unknown", service_name, instance_id, end_ns, attributes
            )
        elif known.state == state:
            known.since_ns = end_ns  # an earlier span of the same state: it began then
        else:
            settled.add(tier)
    for health in states.values():
        if health.state == "bypassed" and health.bypass_s is not None:
            health.bypassed_until_ns = health.updated_ns + int(health.bypass_s * 1e9)
    return list(states.values())


def _health(engine_id, service_name, instance_id, end_ns: int, attributes: dict) -> TierHealth:
    reason, failures = attributes.get(names.TIER_REASON), attributes.get(names.TIER_FAILURES)
    bypass_s = attributes.get(names.TIER_BYPASS_S)
    return TierHealth(
        engine_id=engine_id,
        service_name=service_name,
        instance_id=instance_id,
        tier=attributes[names.TIER],
        state=attributes[names.TIER_STATE],
        reason=reason if isinstance(reason, str) else None,
        failures=failures if type(failures) is int else None,
        bypass_s=float(bypass_s) if isinstance(bypass_s, int | float) else None,
        since_ns=end_ns,
        updated_ns=end_ns,
        bypassed_until_ns=None,
    )


def _attributes(value: str) -> dict:
    try:
        found = json.loads(value)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}
