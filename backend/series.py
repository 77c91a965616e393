"""Time series for the overview: hit rate, bytes/s per path, leases held, failures per cause,
TTFT and its KV-wait part, one point per step of a window, from the backend's aggregates."""

from pydantic import BaseModel
from sqlmodel import Session

from kvscope.backend import aggregates as sql
from kvscope.backend.incidents import IncidentPublic

MAX_BUCKETS = 240
"""Steps per window at most: a finer step is widened to keep responses small."""


class HitPoint(BaseModel):
    time_ns: int
    lookups: int
    hit_requests: int
    hit_tokens: int
    prompt_tokens: int
    hit_rate: float | None  # hit tokens over prompt tokens


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
    """The step asked for, or a sixtieth of the window, never more than MAX_BUCKETS."""
    wanted = step_s if step_s else window_s / 60
    return max(wanted, window_s / MAX_BUCKETS, 0.001)


def build(session: Session, bounds: dict, incidents: list[IncidentPublic]) -> Series:
    connection = session.connection()
    since, step = bounds["since"], bounds["step"]
    count = max(1, -(-(bounds["until"] - since) // step))
    times = [since + i * step for i in range(count)]
    return Series(
        since_ns=since,
        until_ns=bounds["until"],
        step_s=step / 1e9,
        hits=_hits(sql.rows(connection, sql.HITS_PER_BUCKET, bounds), since, step),
        bytes=[
            BytesPoint(
                time_ns=since + int(bucket) * step,
                direction=str(direction),
                bytes=int(total),
                bytes_per_s=int(total) / (step / 1e9),
            )
            for bucket, direction, total in sql.rows(connection, sql.BYTES_PER_BUCKET, bounds)
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


def _bucket(time_ns: int, since: int, step: int) -> int:
    return since + (time_ns - since) // step * step


def _hits(buckets: list[tuple], since: int, step: int) -> list[HitPoint]:
    return [
        HitPoint(
            time_ns=since + int(bucket) * step,
            lookups=n,
            hit_requests=hit_n or 0,
            hit_tokens=tokens or 0,
            prompt_tokens=prompt or 0,
            hit_rate=tokens / prompt if prompt else None,
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


def _ttft(connection, bounds: dict) -> list[TtftPoint]:
    since, step = bounds["since"], bounds["step"]
    ttft: dict[int, list[float]] = {}
    for time_ns, ms in sql.rows(connection, sql.TTFT_SAMPLES, bounds):
        ttft.setdefault(_bucket(time_ns, since, step), []).append(ms)
    waits: dict[int, list[float]] = {}
    for allocated, loaded in sql.rows(connection, sql.KV_WAITS, bounds):
        waits.setdefault(_bucket(allocated, since, step), []).append(
            max(0.0, (loaded - allocated) / 1e6)
        )
    points = []
    for at in sorted(set(ttft) | set(waits)):
        p50, p95 = sql.percentiles(sorted(ttft.get(at, [])))
        w50, w95 = sql.percentiles(sorted(waits.get(at, [])))
        points.append(
            TtftPoint(
                time_ns=at,
                requests=len(ttft.get(at, [])),
                ttft_p50_ms=p50,
                ttft_p95_ms=p95,
                kv_waits=len(waits.get(at, [])),
                kv_wait_p50_ms=w50,
                kv_wait_p95_ms=w95,
            )
        )
    return points
