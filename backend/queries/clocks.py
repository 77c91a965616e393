"""Clock offset of each reporting process against the backend's clock, from span end vs receipt.

A span ends on its host's clock and is received on the backend's: received - end is the
export delay (never negative) minus the host's offset (host clock - backend clock). Over many
exports the smallest delay is close to zero, so -min(received - end) estimates the offset from
below: the true offset is that plus the smallest export delay. Timelines that join spans of
hosts whose estimates differ by more than a threshold put events in a false order by up to
that difference; this module says so instead of hiding it.
"""

import json

from pydantic import BaseModel
from sqlalchemy import Connection, bindparam, text

SAMPLE = 20_000
"""Newest spans the estimate reads (a primary-key range: no scan of the span table)."""

MIN_SAMPLES = 20
"""Fewer spans than this from a process: its estimate is shown but not trusted for the flag
(a quiet process's smallest delay can be a whole export interval)."""

THRESHOLD_MS = 50.0
"""Default estimate spread beyond which mixed timelines are flagged."""

_LAGS = text(
    "SELECT instance_id, COUNT(*), MIN(received_ns - end_ns), MAX(received_ns) FROM span "
    "WHERE id > :low AND instance_id IS NOT NULL GROUP BY instance_id"
)
_PROCESSES = text(
    "SELECT instance_id, service_name, engine_id, resource FROM process WHERE instance_id IN :ids"
).bindparams(bindparam("ids", expanding=True))


class ProcessClock(BaseModel):
    instance_id: str
    service_name: str | None
    engine_id: str | None
    host: str | None
    samples: int
    offset_ms: float
    """Estimated host clock minus backend clock; the true offset is at least this."""
    trusted: bool
    last_received_ns: int


class Clocks(BaseModel):
    threshold_ms: float
    processes: list[ProcessClock]
    spread_ms: float | None
    """Largest minus smallest trusted offset; None with fewer than two trusted processes."""
    mixed: bool
    """The spread is over the threshold: timelines across these processes may misorder."""


def estimate(connection: Connection, threshold_ms: float = THRESHOLD_MS) -> Clocks:
    top = connection.execute(text("SELECT MAX(id) FROM span")).scalar()
    rows = connection.execute(_LAGS, {"low": (top or 0) - SAMPLE}).all() if top else []
    names = {}
    if rows:
        found = connection.execute(_PROCESSES, {"ids": [row[0] for row in rows]}).all()
        names = {row[0]: row for row in found}
    processes = [_process(row, names.get(row[0])) for row in rows]
    processes.sort(key=lambda p: (p.engine_id or "", p.service_name or "", p.instance_id))
    spread = spread_ms([p.offset_ms for p in processes if p.trusted])
    return Clocks(
        threshold_ms=threshold_ms,
        processes=processes,
        spread_ms=spread,
        mixed=spread is not None and spread > threshold_ms,
    )


def spread_ms(offsets: list[float]) -> float | None:
    return max(offsets) - min(offsets) if len(offsets) >= 2 else None


def _process(row, known) -> ProcessClock:
    instance_id, samples, min_lag_ns, last_received_ns = row
    service_name, engine_id, resource = (known[1], known[2], known[3]) if known else (None,) * 3
    return ProcessClock(
        instance_id=instance_id,
        service_name=service_name,
        engine_id=engine_id,
        host=_host(resource),
        samples=int(samples),
        offset_ms=round(-int(min_lag_ns) / 1e6, 3),
        trusted=int(samples) >= MIN_SAMPLES,
        last_received_ns=int(last_received_ns),
    )


def _host(resource: str | None) -> str | None:
    try:
        found = json.loads(resource or "{}")
    except ValueError:
        return None
    host = found.get("host.name") if isinstance(found, dict) else None
    return host if isinstance(host, str) else None
