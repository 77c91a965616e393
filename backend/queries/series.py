"""Time series for the overview: hit rate, bytes/s per path, leases held, failures per cause,
TTFT and its KV-wait part, one point per step of a window, from per-second rollups."""

import math

from pydantic import BaseModel
from sqlmodel import Session

from kvscope.backend.db.rollups import RESOLUTION_NS, bin_bounds_ms
from kvscope.backend.queries import aggregates as sql
from kvscope.backend.queries.incidents import IncidentPublic
from kvscope.traces.hit_rate import hit_rate

MAX_BUCKETS = 240
"""Steps per window at most: a finer step is widened to keep responses small."""


class HitPoint(BaseModel):
    time_ns: int
    lookups: int
    hit_requests: int
    hit_tokens: int
    prompt_tokens: int
    hit_rate: float | None  # traces.hit_rate.hit_rate of the step's totals


class BytesPoint(BaseModel):
    time_ns: int
    direction: str
    bytes: int
    bytes_per_s: float


class LeasePoint(BaseModel):
    time_ns: int
    held: int


class FailurePoint(BaseModel):
    time_ns: int
    cause: str
    incidents: int


class TtftPoint(BaseModel):
    time_ns: int
    requests: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    kv_waits: int
    kv_wait_p50_ms: float | None
    kv_wait_p95_ms: float | None


class Series(BaseModel):
    since_ns: int
    until_ns: int
    step_s: float
    hits: list[HitPoint]
    bytes: list[BytesPoint]
    leases: list[LeasePoint]
    failures: list[FailurePoint]
    ttft: list[TtftPoint]


def step_for(window_s: float, step_s: float | None) -> float:
    """The step asked for, or a sixtieth of the window, never more than MAX_BUCKETS; in whole
    seconds (the rollups' resolution)."""
    wanted = max(step_s if step_s else window_s / 60, window_s / MAX_BUCKETS, 0.001)
    resolution_s = RESOLUTION_NS / 1e9
    return math.ceil(wanted / resolution_s - 1e-9) * resolution_s


def build(session: Session, bounds: dict, incidents: list[IncidentPublic]) -> Series:
    """The series over bounds (since and step whole seconds: rollup rows are never split)."""
    connection = session.connection()
    since, step = bounds["since"], bounds["step"]
    count = max(1, -(-(bounds["until"] - since) // step))
    times = [since + i * step for i in range(count)]
    return Series(
        since_ns=since,
        until_ns=bounds["until"],
        step_s=step / 1e9,
        hits=_hits(sql.rows(connection, sql.ROLLED_HITS, {**bounds, "metric": "hit"}), since, step),
        bytes=[
            BytesPoint(
                time_ns=since + int(bucket) * step,
                direction=direction or "unknown",
                bytes=int(total),
                bytes_per_s=int(total) / (step / 1e9),
            )
            for bucket, direction, _, total in _labelled(connection, "bytes", bounds)
        ],
        leases=[
            LeasePoint(time_ns=at, held=held)
            for at, held in zip(
                times,
                sql.held_at(
                    sql.rows(connection, sql.LEASES_IN_WINDOW, bounds), [t + step for t in times]
                ),
                strict=True,
            )
        ],
        failures=_failures(incidents, since, step),
        ttft=_ttft(connection, bounds),
    )


def _labelled(connection, metric: str, bounds: dict) -> list[tuple]:
    return sorted(sql.rows(connection, sql.ROLLED_BY_LABEL, {**bounds, "metric": metric}))


def _bucket(time_ns: int, since: int, step: int) -> int:
    return since + (time_ns - since) // step * step


def _hits(buckets: list[tuple], since: int, step: int) -> list[HitPoint]:
    return [
        HitPoint(
            time_ns=since + int(bucket) * step,
            lookups=int(n),
            hit_requests=int(hit_n or 0),
            hit_tokens=int(tokens or 0),
            prompt_tokens=int(prompt or 0),
            hit_rate=hit_rate(tokens or 0, prompt or 0),
        )
        for bucket, n, hit_n, tokens, prompt in sorted(buckets)
    ]


def short_cause(cause: str | None) -> str:
    """'InjectedFault: injected: load 3 ...' -> 'InjectedFault'."""
    return (cause or "unknown").split(":", 1)[0].strip() or "unknown"


def _failures(incidents: list[IncidentPublic], since: int, step: int) -> list[FailurePoint]:
    counts: dict[tuple[int, str], int] = {}
    for incident in incidents:
        key = (_bucket(incident.time_ns, since, step), short_cause(incident.cause))
        counts[key] = counts.get(key, 0) + 1
    return [
        FailurePoint(time_ns=at, cause=cause, incidents=n)
        for (at, cause), n in sorted(counts.items())
    ]


def histograms(rows: list[tuple], since: int, step: int) -> dict[int, list[tuple[int, int]]]:
    """{step start: [(bin, count), ...] in ascending bins} from rolled (bucket, label, n) rows."""
    found: dict[int, list[tuple[int, int]]] = {}
    for bucket, label, n, _ in rows:
        found.setdefault(since + int(bucket) * step, []).append((int(label), int(n)))
    return {at: sorted(bins) for at, bins in found.items()}


def quantile(bins: list[tuple[int, int]], q: float) -> float | None:
    """The q-quantile (statistics' 'inclusive' method) of binned values, each value read as
    its bin's middle: within half a bin (5%) of the exact one, for values in one bin."""
    total = sum(n for _, n in bins)
    if not total:
        return None
    position = q * (total - 1)
    low, high = _nth(bins, math.floor(position)), _nth(bins, math.ceil(position))
    return low + (high - low) * (position - math.floor(position))


def _nth(bins: list[tuple[int, int]], index: int) -> float:
    seen = 0
    for label, n in bins:
        seen += n
        if index < seen:
            lo, hi = bin_bounds_ms(str(label))
            return (lo + hi) / 2
    raise IndexError(index)


def _ttft(connection, bounds: dict) -> list[TtftPoint]:
    since, step = bounds["since"], bounds["step"]
    ttft = histograms(_labelled(connection, "ttft", bounds), since, step)
    waits = histograms(_labelled(connection, "kv_wait", bounds), since, step)
    points = []
    for at in sorted(set(ttft) | set(waits)):
        mine, wait = ttft.get(at, []), waits.get(at, [])
        points.append(
            TtftPoint(
                time_ns=at,
                requests=sum(n for _, n in mine),
                ttft_p50_ms=quantile(mine, 0.5),
                ttft_p95_ms=quantile(mine, 0.95),
                kv_waits=sum(n for _, n in wait),
                kv_wait_p50_ms=quantile(wait, 0.5),
                kv_wait_p95_ms=quantile(wait, 0.95),
            )
        )
    return points
