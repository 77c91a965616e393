"""Prices hit tokens in seconds with the deployment's own measured load and prefill rates."""

import json
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from kvscope.traces import names

# A worker's transfer spans may name no engine: they are its process's (instance_id).
_TRANSFERS = text(
    "SELECT attributes, start_ns, end_ns FROM span WHERE name = :name "
    "AND start_ns >= :since AND start_ns < :until AND (engine_id = :engine OR "
    "(engine_id IS NULL AND instance_id IN (SELECT DISTINCT instance_id FROM span "
    "WHERE engine_id = :engine AND start_ns >= :since AND start_ns < :until)))"
)
_STEP_HOOK = names.SPAN_HOOK_PREFIX + "build_connector_meta"


@dataclass(frozen=True)
class Rates:
    """Tokens a second this engine loaded from the host pool and computed in its steps (None
    where the window has none)."""

    load_tokens_per_s: float | None
    prefill_tokens_per_s: float | None

    def seconds_saved(self, hit_tokens: int) -> float | None:
        """Prefill time the hits spare minus the time their loads take."""
        if not self.load_tokens_per_s or not self.prefill_tokens_per_s:
            return None
        per_token = 1 / self.prefill_tokens_per_s - 1 / self.load_tokens_per_s
        return hit_tokens * per_token


def measured_rates(
    connection: Connection, engine_id: str, block_size: int, since_ns: int, until_ns: int
) -> Rates:
    """Load rate: blocks of the offload tier's load transfers over their durations. Prefill
    rate: tokens scheduled in steps with KV work (prefills, mostly) over the worker's step
    spans of the same steps."""
    window = {"engine": engine_id, "since": since_ns, "until": until_ns}
    load_tokens = load_s = 0.0
    for attributes, start_ns, end_ns in _rows(connection, names.SPAN_TRANSFER, window):
        if attributes.get(names.TRANSFER_DIRECTION) != "load" or not _ok(attributes):
            continue
        load_tokens += int(attributes.get(names.BLOCK_COUNT) or 0) * block_size
        load_s += _duration_s(attributes, start_ns, end_ns)
    scheduled = {
        attributes.get(names.STEP): int(attributes.get(names.TOKENS_SCHEDULED) or 0)
        for attributes, _, _ in _rows(connection, _STEP_HOOK, window)
    }
    step_tokens = step_s = 0.0
    for attributes, start_ns, end_ns in _rows(connection, names.SPAN_STEP, window):
        tokens = scheduled.get(attributes.get(names.STEP), 0)
        if tokens > 0:
            step_tokens += tokens
            step_s += (end_ns - start_ns) / 1e9
    return Rates(
        load_tokens / load_s if load_s > 0 and load_tokens else None,
        step_tokens / step_s if step_s > 0 else None,
    )


def _rows(connection: Connection, name: str, window: dict):
    for attributes_json, start_ns, end_ns in connection.execute(
        _TRANSFERS, {**window, "name": name}
    ):
        yield json.loads(attributes_json or "{}"), start_ns, end_ns


def _ok(attributes: dict) -> bool:
    return attributes.get(names.TRANSFER_OK) is not False


def _duration_s(attributes: dict, start_ns: int, end_ns: int) -> float:
    duration_ms = attributes.get(names.TRANSFER_DURATION_MS)
    if isinstance(duration_ms, int | float):
        return duration_ms / 1000
    return (end_ns - start_ns) / 1e9
