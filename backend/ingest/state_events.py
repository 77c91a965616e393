"""Span events about leases, blocks and load failures, turned into rows of the state tables."""

import json

from kvscope.backend.ingest.record import clean
from kvscope.traces import names

_BLOCK_STATES = {
    names.EVENT_BLOCK_STORED: "stored",
    names.EVENT_BLOCK_EVICTED: "evicted",
    names.EVENT_BLOCK_LOADED: "loaded",
    # A refused eviction proves the blocks are still there.
    names.EVENT_EVICTION_REFUSED: "stored",
}
_LEASE_ENDS = {
    names.EVENT_LEASE_ACQUIRED: None,
    names.EVENT_LEASE_RELEASED: "released",
    names.EVENT_LEASE_EXPIRED: "expired",
}


def engine_key(span) -> str:
    """Which engine's state a fact belongs to: its engine id, else the emitting process."""
    return span.engine_id or span.instance_id or "unknown"


def apply(facts, span, attributes: dict, event: dict) -> None:
    """Adds the rows one state event implies; events of other kinds are ignored."""
    name = event["name"]
    if name in _BLOCK_STATES:
        _blocks(facts, span, attributes, event, _BLOCK_STATES[name])
    elif name in _LEASE_ENDS:
        _lease(facts, span, attributes, event, _LEASE_ENDS[name])
    elif name == names.EVENT_LOAD_FAILED:
        facts.failures.append(
            failure_row(
                facts, span, attributes, event["attributes"], event["time_ns"], "load_failed"
            )
        )


def _get(key: str, event_attributes: dict, attributes: dict):
    value = event_attributes.get(key)
    return attributes.get(key) if value is None else value


def _str(value) -> str | None:
    return None if value is None else clean(str(value))


def _ints(value) -> list[int]:
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def failure_row(
    facts, span, attributes: dict, event_attributes: dict, time_ns: int, kind: str
) -> dict:
    block_ids = _get(names.LOAD_ERROR_BLOCK_IDS, event_attributes, attributes)
    if block_ids is None:
        block_ids = _get(names.BLOCK_IDS, event_attributes, attributes)
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "ordinal": len(facts.failures) - facts.failures_before,
        "time_ns": time_ns,
        "kind": kind,
        "cause": _str(_get(names.FAILURE_CAUSE, event_attributes, attributes)),
        "policy": _str(_get(names.FAILURE_POLICY, event_attributes, attributes)),
        "outcome": _str(_get(names.FAILURE_OUTCOME, event_attributes, attributes)),
        "request_id": _str(
            _get(names.REQUEST_ID, event_attributes, attributes)
            or _get(names.LEASE_HOLDER, event_attributes, attributes)
        ),
        "engine_id": engine_key(span),
        "lease_id": _str(_get(names.LEASE_ID, event_attributes, attributes)),
        "block_ids": json.dumps(_ints(block_ids)) if block_ids is not None else None,
        "child": _str(_get(names.CONNECTOR_CHILD, event_attributes, attributes)),
        "fallback_child": _str(event_attributes.get(names.FALLBACK_CHILD)),
    }


def _lease(facts, span, attributes: dict, event: dict, outcome: str | None) -> None:
    event_attributes = event["attributes"]
    lease_id = _get(names.LEASE_ID, event_attributes, attributes)
    if lease_id is None:
        return
    host_block_ids = _ints(_get(names.HOST_BLOCK_IDS, event_attributes, attributes))
    timeout_s = _get(names.LEASE_TIMEOUT_S, event_attributes, attributes)
    ended = outcome is not None
    facts.leases.append(
        {
            "engine_id": engine_key(span),
            "lease_id": _str(lease_id),
            "holder": _str(_get(names.LEASE_HOLDER, event_attributes, attributes)),
            "host_block_ids": json.dumps(host_block_ids),
            "acquired_ns": None if ended else event["time_ns"],
            "ended_ns": event["time_ns"] if ended else None,
            "outcome": (_str(event_attributes.get(names.LEASE_OUTCOME)) or outcome)
            if ended
            else None,
            "timeout_s": float(timeout_s) if isinstance(timeout_s, int | float) else None,
            "instance_id": span.instance_id,
        }
    )
    if outcome == "expired":
        failure = failure_row(
            facts, span, attributes, event_attributes, event["time_ns"], "lease_expired"
        )
        failure["cause"] = failure["cause"] or "lease_expired"
        facts.failures.append(failure)


def _blocks(facts, span, attributes: dict, event: dict, state: str) -> None:
    event_attributes = event["attributes"]
    host_ids = _ints(_get(names.HOST_BLOCK_IDS, event_attributes, attributes))
    tier = _str(_get(names.BLOCK_TIER, event_attributes, attributes))
    tier = tier or ("host" if host_ids else "device")
    ids = (
        host_ids
        if tier == "host" and host_ids
        else _ints(_get(names.BLOCK_IDS, event_attributes, attributes))
    )
    hashes = _get(names.BLOCK_HASHES, event_attributes, attributes)
    hashes = [_str(h) for h in hashes] if isinstance(hashes, list) else []
    paired = len(hashes) == len(ids)
    # Slots (ids) are the state a pool has; a hash alone names content with no known slot.
    addresses: list[tuple[str, int | None, str | None]] = [
        (f"id:{block_id}", block_id, hashes[i] if paired else None)
        for i, block_id in enumerate(ids)
    ]
    if not ids:
        addresses = [(f"hash:{block_hash}", None, block_hash) for block_hash in hashes]
    groups = _groups(_get(names.KV_CACHE_GROUP_IDS, event_attributes, attributes), len(addresses))
    holder = _get(names.REQUEST_ID, event_attributes, attributes) or _get(
        names.LEASE_HOLDER, event_attributes, attributes
    )
    for (address, block_id, block_hash), group in zip(addresses, groups, strict=True):
        facts.blocks.append(
            {
                "engine_id": engine_key(span),
                "tier": tier,
                "address": group_address(address, group),
                "block_id": block_id,
                "block_hash": block_hash,
                "state": state,
                "updated_ns": event["time_ns"],
                "instance_id": span.instance_id,
                "request_id": _str(holder),
                "kv_group": group,
            }
        )


def _groups(value, count: int) -> list[int]:
    """Each block's KV cache group, pairwise; spans without group ids (one group) mean 0."""
    groups = _ints(value)
    return groups if len(groups) == count else [0] * count


def group_address(address: str, group: int) -> str:
    """Block ids are addresses within one KV cache group: other groups' slots are kept apart.

    Group 0 keeps the plain address, so rows stored before groups were named stay the same.
    """
    return address if group == 0 else f"g{group}:{address}"
