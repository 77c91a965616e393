"""Silent recomputes: requests that ended normally although a KV load failed and was recomputed,
per engine and cause, with the prefill tokens the recompute cost."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field
from sqlalchemy import Connection, select
from sqlmodel import col

from kvscope.backend.db.models import Request, TimelinePoint
from kvscope.backend.db.request_numbers import numbers_of_pairs
from kvscope.backend.queries.incidents import IncidentPublic
from kvscope.traces.outcomes import RECOMPUTED

NORMAL_ENDS = ("finished", "finished_stopped", "finished_length_capped", "finished_repetition")
"""Request statuses a client sees as a normal answer (vLLM's stop, length and repetition ends;
'finished' when the span named none). Aborted, ignored and errored requests are not silent."""

LONGEST_REQUEST_NS = 3600 * 10**9
"""How far before the window a failure of a request ending in it is looked for (an hour)."""

CLOCK_SLACK_NS = 10**9
"""A failure is a request's when reported within its span, give or take this (a worker
process stamps it with its own clock)."""

MAX_REQUEST_IDS = 50
"""Requests listed per row (the row counts them all)."""

MAX_CAUSE_CHARS = 64

TOKENS_BASIS = "tokens_to_load"
"""How recomputed tokens are counted: the failed load's tokens to load (num_external_tokens of
vLLM's update_state_after_alloc before the failure). vLLM rewinds a request to its first failed
block, so a load that failed whole (as kvscope's connectors report one) recomputes exactly
those tokens; when only later blocks of a load failed it is an upper bound. A load failed by
request (vLLM's failed_recving) rewinds to 0, recomputing the local prefix hit too: not counted."""

_CHUNK = 500  # request ids per IN list: well under SQLite's and PostgreSQL's parameter limits


class RecomputedRequest(BaseModel):
    id: int = Field(description="the request row's id: the Requests page opens ?request=<id>")
    request_id: str
    end_ns: int
    load_failures: int
    recomputed_tokens: int | None = Field(description="None: no tokens to load were reported")


class SilentRecomputes(BaseModel):
    """One engine's requests that got a normal answer although a load of one cause failed."""

    engine_id: str
    cause: str
    requests: int
    load_failures: int
    recomputed_tokens: int
    tokens_unknown: int = Field(description="requests whose failed load's tokens are unknown")
    items: list[RecomputedRequest] = Field(description=f"the newest {MAX_REQUEST_IDS} requests")
    truncated: bool


class RecomputesPublic(BaseModel):
    window_s: float | None
    since_ns: int | None
    tokens_basis: str = TOKENS_BASIS
    requests: int = Field(description="distinct requests over all rows")
    recomputed_tokens: int
    rows: list[SilentRecomputes]


def short_cause(cause: str | None) -> str:
    """'InjectedFault: load 3 of plan ...' -> 'InjectedFault': an exception's type, a cause's
    word; the long text stays on the failure reports."""
    text = (cause or "unknown").split(":", 1)[0].strip() or "unknown"
    return text[:MAX_CAUSE_CHARS]


def recomputed(incidents: Iterable[IncidentPublic]) -> list[IncidentPublic]:
    """Incidents of a request whose outcome was (or, by its policy, must have been) a recompute."""
    return [i for i in incidents if i.request_id and i.engine_id and i.outcome == RECOMPUTED]


def _key(incident: IncidentPublic) -> tuple[str, str]:
    """(engine, request id) of an incident that recomputed() kept: it names both."""
    assert incident.engine_id is not None and incident.request_id is not None
    return incident.engine_id, incident.request_id


@dataclass
class _Row:
    requests: dict[int, RecomputedRequest] = field(default_factory=dict)
    load_failures: int = 0
    allocations: set[int] = field(default_factory=set)


def silent_recomputes(
    connection: Connection,
    incidents: Iterable[IncidentPublic],
    since_ns: int | None,
    until_ns: int | None,
    window_s: float | None = None,
) -> RecomputesPublic:
    """The requests ended normally in [since_ns, until_ns) (None: unbounded) with a recomputed
    load failure, grouped by engine and short cause. `incidents` should reach LONGEST_REQUEST_NS
    before since_ns: a request's failure comes before its end."""
    failed = recomputed(incidents)
    keys = {_key(i) for i in failed}
    ended = _ended_normally(connection, keys, since_ns, until_ns)
    allocations = _allocations(connection, set(ended))
    tokens_of = {a[0]: a[2] for found in allocations.values() for a in found}
    rows: dict[tuple[str, str], _Row] = {}
    for incident in sorted(failed, key=lambda i: (i.time_ns, i.id)):
        engine_id, request_id = _key(incident)
        request = _request_of(ended.get((engine_id, request_id), ()), incident)
        if request is None:
            continue
        row = rows.setdefault((engine_id, short_cause(incident.cause)), _Row())
        row.load_failures += 1
        public = row.requests.setdefault(
            request.id,
            RecomputedRequest(
                id=request.id,
                request_id=request.request_id,
                end_ns=request.end_ns,
                load_failures=0,
                recomputed_tokens=None,
            ),
        )
        public.load_failures += 1
        # Two failures after one allocation (a Multi's two children, say) cost its tokens once.
        alloc = _allocation_before(allocations.get(request.key, []), request, incident.time_ns)
        if alloc is not None and alloc[0] not in row.allocations:
            row.allocations.add(alloc[0])
            public.recomputed_tokens = (public.recomputed_tokens or 0) + alloc[2]
    public_rows = [_public(engine, cause, row, tokens_of) for (engine, cause), row in rows.items()]
    public_rows.sort(key=lambda r: (-r.requests, r.engine_id, r.cause))
    every_alloc = set().union(*(row.allocations for row in rows.values()))
    return RecomputesPublic(
        window_s=window_s,
        since_ns=since_ns,
        requests=len({key for row in rows.values() for key in row.requests}),
        recomputed_tokens=sum(tokens_of[a] for a in every_alloc),
        rows=public_rows,
    )


@dataclass(frozen=True)
class _Ended:
    id: int
    request_id: str
    engine_id: str
    start_ns: int
    end_ns: int

    @property
    def key(self) -> tuple[str, str]:
        return self.engine_id, self.request_id


def _ended_normally(
    connection: Connection, keys: set[tuple[str, str]], since_ns: int | None, until_ns: int | None
) -> dict[tuple[str, str], list[_Ended]]:
    """The request rows of these (engine, request id) pairs that ended in the window with a
    normal status."""
    found: dict[tuple[str, str], list[_Ended]] = {}
    for chunk in _chunks(sorted(keys)):
        query = select(
            col(Request.id),
            col(Request.request_id),
            col(Request.engine_id),
            col(Request.start_ns),
            col(Request.end_ns),
        ).where(
            col(Request.request_no).in_(numbers_of_pairs(chunk)),
            col(Request.status).in_(NORMAL_ENDS),
            col(Request.end_ns).is_not(None),
        )
        if since_ns is not None:
            query = query.where(col(Request.end_ns) >= since_ns)
        if until_ns is not None:
            query = query.where(col(Request.end_ns) < until_ns)
        for row_id, request_id, engine_id, start_ns, end_ns in connection.execute(query):
            # Rows of the pairs asked for (both named), ended: the query's conditions.
            assert row_id is not None and request_id is not None and engine_id is not None
            assert end_ns is not None
            ended = _Ended(row_id, request_id, engine_id, start_ns, end_ns)
            found.setdefault(ended.key, []).append(ended)
    return found


def _allocations(
    connection: Connection, keys: set[tuple[str, str]]
) -> dict[tuple[str, str], list[tuple[int, int, int]]]:
    """Each request's loads as vLLM allocated them: (point id, time, tokens to load), in time."""
    found: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    point = TimelinePoint
    for chunk in _chunks(sorted(keys)):
        query = (
            select(
                col(point.id),
                col(point.engine_id),
                col(point.request_id),
                col(point.time_ns),
                col(point.value),
            )
            .where(
                col(point.request_no).in_(numbers_of_pairs(chunk)),
                col(point.point) == "blocks_allocated",
                col(point.value).is_not(None),
            )
            .order_by(col(point.time_ns), col(point.id))
        )
        for point_id, engine_id, request_id, time_ns, tokens in connection.execute(query):
            # Points of the pairs asked for (both named), with a value: the query's conditions.
            assert point_id is not None and engine_id is not None and request_id is not None
            assert tokens is not None
            found.setdefault((engine_id, request_id), []).append((point_id, time_ns, tokens))
    return found


def _request_of(candidates: Sequence[_Ended], incident: IncidentPublic) -> _Ended | None:
    """The request row whose span holds the failure (a request id may recur across restarts)."""
    return next(
        (
            r
            for r in candidates
            if r.start_ns - CLOCK_SLACK_NS <= incident.time_ns <= r.end_ns + CLOCK_SLACK_NS
        ),
        None,
    )


def _allocation_before(allocations, request: _Ended, time_ns: int):
    """The request's last load allocated before the failure (within its span)."""
    before = [
        a
        for a in allocations
        if request.start_ns - CLOCK_SLACK_NS <= a[1] <= time_ns + CLOCK_SLACK_NS
    ]
    return before[-1] if before else None


def _public(engine_id: str, cause: str, row: _Row, tokens_of: dict[int, int]) -> SilentRecomputes:
    newest = sorted(row.requests.values(), key=lambda r: (-r.end_ns, -r.id))
    return SilentRecomputes(
        engine_id=engine_id,
        cause=cause,
        requests=len(newest),
        load_failures=row.load_failures,
        recomputed_tokens=sum(tokens_of[a] for a in row.allocations),
        tokens_unknown=sum(r.recomputed_tokens is None for r in newest),
        items=newest[:MAX_REQUEST_IDS],
        truncated=len(newest) > MAX_REQUEST_IDS,
    )


def _chunks(keys: list) -> Iterable[list]:
    for start in range(0, len(keys), _CHUNK):
        yield keys[start : start + _CHUNK]
