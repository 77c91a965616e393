"""Miss reasons of a window: per request, and per engine as shares of the missed tokens."""

from pydantic import BaseModel, Field
from sqlalchemy import Connection, select
from sqlmodel import col

from kvscope.backend.db.models import Failure
from kvscope.backend.queries.accounting import LONGEST_REQUEST_NS, request_accounts
from kvscope.backend.queries.misses.explain import RequestMisses, explain
from kvscope.backend.queries.misses.history import read_accesses
from kvscope.backend.queries.misses.vocabulary import REASONS
from kvscope.backend.queries.misses.walk import EngineWalk
from kvscope.traces.outcomes import RECOMPUTED

HISTORY_S = 3600.0
"""How far before the window the host pools' stores and evictions are read by default: a
block stored and evicted before that reads as never stored."""

MAX_REQUESTS = 50
"""Requests listed per answer, the newest (the per-engine totals count them all)."""


class EngineMisses(BaseModel):
    engine_id: str
    requests: int
    prompt_tokens: int
    missed_tokens: int
    tokens_by_reason: dict[str, int] = Field(description="they add up to missed_tokens")
    share_by_reason: dict[str, float] = Field(description="of the missed tokens")
    violations: int


class MissesPublic(BaseModel):
    window_s: float | None
    since_ns: int | None
    history_s: float
    reasons: dict[str, str] = Field(default=REASONS, description="what each reason means")
    engines: list[EngineMisses]
    requests: list[RequestMisses] = Field(description=f"the newest {MAX_REQUESTS}")
    violations: list[RequestMisses] = Field(description=f"the newest {MAX_REQUESTS}")


def walks(
    connection: Connection, since_ns: int, until_ns: int | None, history_s: float
) -> dict[str, EngineWalk]:
    """Every engine's host pool walked from history_s before since_ns, lookups kept and
    accesses counted from since_ns (stores and evictions before it are the history)."""
    found: dict[str, EngineWalk] = {}
    start = since_ns - int(history_s * 1e9)
    for access in read_accesses(connection, start, until_ns or 2**63 - 1):
        walk = found.setdefault(access.engine_id, EngineWalk(since_ns))
        walk.feed(access)
    return found


def explained(
    connection: Connection, since_ns: int | None, until_ns: int | None, history_s: float
) -> list[RequestMisses]:
    """Every request that ended in [since_ns, until_ns) and was accounted, explained."""
    accounts = request_accounts(connection, since_ns, until_ns)
    if not accounts:
        return []
    first_lookup = min(account.lookup_ns for account in accounts)
    engine_walks = walks(connection, first_lookup - 10**9, until_ns, history_s)
    failed = recomputed_loads(connection, first_lookup - 10**9, until_ns)
    return [
        explain(
            account,
            engine_walks.get(account.engine_id),
            account.request_id in failed,
        )
        for account in accounts
    ]


def misses(
    connection: Connection,
    since_ns: int | None,
    until_ns: int | None,
    window_s: float | None = None,
    history_s: float = HISTORY_S,
) -> MissesPublic:
    found = explained(connection, since_ns, until_ns, history_s)
    engines: dict[str, list[RequestMisses]] = {}
    for request in found:
        engines.setdefault(request.engine_id, []).append(request)
    newest = sorted(found, key=lambda r: (-r.end_ns, -r.id))
    return MissesPublic(
        window_s=window_s,
        since_ns=since_ns,
        history_s=history_s,
        engines=[engine_misses(engine, rows) for engine, rows in sorted(engines.items())],
        requests=newest[:MAX_REQUESTS],
        violations=[r for r in newest if r.violation is not None][:MAX_REQUESTS],
    )


def engine_misses(engine_id: str, rows: list[RequestMisses]) -> EngineMisses:
    tokens: dict[str, int] = {}
    for request in rows:
        for reason in request.reasons:
            tokens[reason.reason] = tokens.get(reason.reason, 0) + reason.tokens
    missed = sum(r.missed_tokens for r in rows)
    ordered = {reason: tokens[reason] for reason in REASONS if reason in tokens}
    return EngineMisses(
        engine_id=engine_id,
        requests=len(rows),
        prompt_tokens=sum(r.prompt_tokens for r in rows),
        missed_tokens=missed,
        tokens_by_reason=ordered,
        share_by_reason={k: v / missed for k, v in ordered.items()} if missed else {},
        violations=sum(r.violation is not None for r in rows),
    )


def recomputed_loads(connection: Connection, since_ns: int, until_ns: int | None) -> set[str]:
    """The requests whose load failed and was recomputed in the range (by request id: a
    worker's report may name its process, not its engine)."""
    query = select(col(Failure.request_id)).where(
        col(Failure.kind).in_(("load_failed", "transfer_failed")),
        col(Failure.outcome) == RECOMPUTED,
        col(Failure.time_ns) >= since_ns,
        col(Failure.request_id).is_not(None),
    )
    if until_ns is not None:
        query = query.where(col(Failure.time_ns) < until_ns + LONGEST_REQUEST_NS)
    # Only rows that name a request (the query's condition).
    return {request for (request,) in connection.execute(query) if request is not None}


def request_misses(
    connection: Connection, row_id: int, end_ns: int, history_s: float = HISTORY_S
) -> RequestMisses | None:
    """One ended request's reasons (None: not accounted, e.g. still running or never looked
    up), its engine's pool walked from history_s before its lookup."""
    accounts = [a for a in request_accounts(connection, end_ns, end_ns + 1) if a.id == row_id]
    if not accounts:
        return None
    account = accounts[0]
    since_ns = account.lookup_ns - 10**9
    engine_walks = walks(connection, since_ns, account.end_ns + 10**9, history_s)
    failed = recomputed_loads(connection, since_ns, account.end_ns)
    return explain(account, engine_walks.get(account.engine_id), account.request_id in failed)
