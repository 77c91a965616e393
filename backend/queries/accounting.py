"""Token accounting per request: prefix-cache hits + external hits by tier (the connector's
lookup) + computed tokens (the prompt tokens vLLM itself did not count as cached) = prompt."""

from dataclasses import dataclass, field

from pydantic import BaseModel, Field
from sqlalchemy import Connection, Select, select, text
from sqlmodel import col

from kvscope.backend.db.models import Lookup, Request, TimelinePoint
from kvscope.backend.db.models.requests import CACHED_TOKEN_POINTS
from kvscope.traces.hit_rate import DEFINITION, hit_rate

LONGEST_REQUEST_NS = 3600 * 10**9
"""How far before the window a lookup of a request ending in it is looked for (an hour)."""

CLOCK_SLACK_NS = 10**9
"""A lookup is a request's when it lies within the request's span, give or take this."""

MAX_VIOLATIONS = 50
"""Requests whose tokens do not add up listed per answer (the per-engine counts are exact)."""

LOCAL = "local"
"""The source of vLLM's own prefix-cache hits."""


def tier_of(connector: str | None) -> str:
    """The KV tier a connector class loads from: the offload connector's host pool, a P2P
    peer, else the class's own name (vLLM's connectors and others)."""
    name = (connector or "unknown").lower()
    if "offload" in name:
        return "host"
    if "p2p" in name or "nixl" in name:
        return "peer"
    return connector or "unknown"


class RequestAccount(BaseModel):
    """One request's tokens by source, and why they do not add up (None: they do)."""

    id: int = Field(description="the request row's id: the Requests page opens ?request=<id>")
    request_id: str
    engine_id: str
    end_ns: int
    prompt_tokens: int
    local_hit_tokens: int
    external_hit_tokens: dict[str, int] = Field(description="per tier: host, peer, ...")
    computed_tokens: int = Field(description="prompt tokens vLLM did not count as cached")
    vllm_local_cached: int | None = Field(description="vLLM's own count, if reported")
    vllm_external_cached: int | None = Field(description="vLLM's own count, if reported")
    violation: str | None
    lookup_ns: int = Field(description="when the lookup vLLM scheduled the request by decided")


class EngineAccount(BaseModel):
    engine_id: str
    requests: int
    prompt_tokens: int
    local_hit_tokens: int
    external_hit_tokens: dict[str, int]
    computed_tokens: int
    hit_rate: float | None = Field(description=DEFINITION)
    violations: int


class AccountingPublic(BaseModel):
    window_s: float | None
    since_ns: int | None
    definition: str = DEFINITION
    engines: list[EngineAccount]
    violations: list[RequestAccount] = Field(description=f"the newest {MAX_VIOLATIONS}")
    violations_total: int


def account(
    prompt: int, local: int, external: dict[str, int], vllm_cached: tuple[int, int] | None
) -> tuple[int, str | None]:
    """(computed tokens, violation) of one request: the connector's hits against the prompt
    and against what vLLM counted cached when it scheduled the request (None: not reported;
    the computed tokens are then what the hits leave)."""
    hits = local + sum(external.values())
    computed = prompt - hits if vllm_cached is None else prompt - sum(vllm_cached)
    if local < 0 or any(tokens < 0 for tokens in external.values()):
        return max(0, computed), f"a negative hit count ({local} local, {external} external)"
    if hits > prompt:
        return max(0, computed), f"hits exceed the prompt: {hits} > {prompt} tokens"
    if vllm_cached is not None and vllm_cached != (local, hits - local):
        return computed, (
            f"vLLM counted {vllm_cached[0]} local + {vllm_cached[1]} external tokens cached, "
            f"the connector's lookup {local} + {hits - local}"
        )
    return computed, None


@dataclass
class _Engine:
    requests: int = 0
    prompt: int = 0
    local: int = 0
    external: dict[str, int] = field(default_factory=dict)
    computed: int = 0
    violations: int = 0


def accounting(
    connection: Connection,
    since_ns: int | None,
    until_ns: int | None,
    window_s: float | None = None,
) -> AccountingPublic:
    """Every request that ended in [since_ns, until_ns) (None: unbounded) with a known prompt
    length and a decided lookup, accounted; totals per engine."""
    engines: dict[str, _Engine] = {}
    bad: list[RequestAccount] = []
    for found in request_accounts(connection, since_ns, until_ns):
        total = engines.setdefault(found.engine_id, _Engine())
        total.requests += 1
        total.prompt += found.prompt_tokens
        total.local += found.local_hit_tokens
        for tier, tokens in found.external_hit_tokens.items():
            total.external[tier] = total.external.get(tier, 0) + tokens
        total.computed += found.computed_tokens
        if found.violation is not None:
            total.violations += 1
            bad.append(found)
    bad.sort(key=lambda r: (-r.end_ns, -r.id))
    return AccountingPublic(
        window_s=window_s,
        since_ns=since_ns,
        engines=[_public(engine, total) for engine, total in sorted(engines.items())],
        violations=bad[:MAX_VIOLATIONS],
        violations_total=len(bad),
    )


def request_accounts(
    connection: Connection, since_ns: int | None, until_ns: int | None
) -> list[RequestAccount]:
    """The accounts of the requests that ended in [since_ns, until_ns), in end order."""
    lookups = _lookups(connection, since_ns, until_ns)
    cached = _vllm_cached(connection, since_ns, until_ns)
    found = []
    for row in _ended(connection, since_ns, until_ns):
        key = (row.engine_id, row.request_id)
        account = _account_of(row, lookups.get(key, []), cached.get(key, []))
        if account is not None:
            found.append(account)
    return found


def _public(engine_id: str, total: _Engine) -> EngineAccount:
    hits = total.local + sum(total.external.values())
    return EngineAccount(
        engine_id=engine_id,
        requests=total.requests,
        prompt_tokens=total.prompt,
        local_hit_tokens=total.local,
        external_hit_tokens=dict(sorted(total.external.items())),
        computed_tokens=total.computed,
        hit_rate=hit_rate(hits, total.prompt),
        violations=total.violations,
    )


@dataclass(frozen=True)
class _Lookup:
    time_ns: int
    id: int
    connector: str | None
    child: str | None
    hit: int
    local: int | None


def _within(row, time_ns: int) -> bool:
    return row.start_ns - CLOCK_SLACK_NS <= time_ns <= row.end_ns + CLOCK_SLACK_NS


def _account_of(row, lookups: list[_Lookup], cached: list[tuple[int, str, int]]):
    """The request's hits as the lookup vLLM scheduled it by: the last decided one before the
    allocation where vLLM counted its cached tokens (its first scheduling; a request the
    budget sent back is asked again, a preempted one's later lookups vLLM does not count),
    else its first decided one; its hits by tier, against vLLM's count."""
    mine = [lk for lk in lookups if _within(row, lk.time_ns)]
    counted = {point: (time_ns, value) for time_ns, point, value in cached if _within(row, time_ns)}
    vllm_cached = None
    if set(counted) == {"vllm_local_cached", "vllm_external_cached"}:
        vllm_cached = (counted["vllm_local_cached"][1], counted["vllm_external_cached"][1])
    composite = [lk for lk in mine if lk.child is None and lk.local is not None]
    if vllm_cached is not None:
        allocated_ns = counted["vllm_local_cached"][0]
        composite = [lk for lk in composite if lk.time_ns <= allocated_ns][-1:] or composite
    if not composite:
        return None
    first = composite[0]
    assert first.local is not None  # composite holds only lookups that counted local hits
    external = {}
    if first.hit:
        external[_serving_tier(first, mine)] = first.hit
    computed, violation = account(row.prompt_tokens, first.local, external, vllm_cached)
    return RequestAccount(
        id=row.id,
        request_id=row.request_id,
        engine_id=row.engine_id,
        end_ns=row.end_ns,
        prompt_tokens=row.prompt_tokens,
        local_hit_tokens=first.local,
        external_hit_tokens=external,
        computed_tokens=computed,
        vllm_local_cached=vllm_cached[0] if vllm_cached else None,
        vllm_external_cached=vllm_cached[1] if vllm_cached else None,
        violation=violation,
        lookup_ns=first.time_ns,
    )


def _serving_tier(first: _Lookup, mine: list[_Lookup]) -> str:
    """A plain connector's tier; a MultiConnector's: that of the first child (in the order
    asked, within the composite's lookup) that hit, as the Multi loads from it."""
    children = [lk for lk in mine if lk.child is not None and lk.time_ns <= first.time_ns]
    asked = {}
    for lookup in children:  # each child's last lookup before the composite decided
        asked[lookup.child] = lookup
    hitting = sorted((lk for lk in asked.values() if lk.hit > 0), key=lambda lk: lk.id)
    return tier_of(hitting[0].connector if hitting else first.connector)


def _ended(connection: Connection, since_ns: int | None, until_ns: int | None) -> list:
    query = select(
        col(Request.id),
        col(Request.request_id),
        col(Request.engine_id),
        col(Request.start_ns),
        col(Request.end_ns),
        col(Request.prompt_tokens),
    ).where(
        col(Request.end_ns).is_not(None),
        col(Request.prompt_tokens).is_not(None),
        col(Request.request_id).is_not(None),
        col(Request.engine_id).is_not(None),
        col(Request.status) != "running",
    )
    if since_ns is not None:
        query = query.where(col(Request.end_ns) >= since_ns)
    if until_ns is not None:
        query = query.where(col(Request.end_ns) < until_ns)
    return list(connection.execute(query.order_by(col(Request.end_ns), col(Request.id))))


def _lookups(
    connection: Connection, since_ns: int | None, until_ns: int | None
) -> dict[tuple[str | None, str | None], list[_Lookup]]:
    """Decided lookups from LONGEST_REQUEST_NS before the window, per (engine, request), in
    the order they were made."""
    query = select(
        col(Lookup.engine_id),
        col(Lookup.request_id),
        col(Lookup.time_ns),
        col(Lookup.id),
        col(Lookup.connector),
        col(Lookup.child),
        col(Lookup.hit_tokens),
        col(Lookup.local_hit_tokens),
    )
    if since_ns is not None:
        query = query.where(col(Lookup.time_ns) >= since_ns - LONGEST_REQUEST_NS)
    if until_ns is not None:
        query = query.where(col(Lookup.time_ns) < until_ns + CLOCK_SLACK_NS)
    # Keyed as stored: a lookup may name no engine or request (no request row matches it then).
    found: dict[tuple[str | None, str | None], list[_Lookup]] = {}
    for (
        engine_id,
        request_id,
        time_ns,
        lookup_id,
        connector,
        child,
        hit,
        local,
    ) in connection.execute(query.order_by(col(Lookup.time_ns), col(Lookup.id))):
        assert lookup_id is not None  # a stored row has its id
        lookup = _Lookup(time_ns, lookup_id, connector, child, hit, local)
        found.setdefault((engine_id, request_id), []).append(lookup)
    return found


def cached_tokens_query(since_ns: int | None, until_ns: int | None) -> Select:
    """The cached-token points of requests that may overlap [since, until), newest first."""
    point = TimelinePoint
    query = select(
        col(point.engine_id),
        col(point.request_id),
        col(point.time_ns),
        col(point.point),
        col(point.value),
    ).where(text(CACHED_TOKEN_POINTS))  # as written: their partial index's condition
    if since_ns is not None:
        query = query.where(col(point.time_ns) >= since_ns - LONGEST_REQUEST_NS)
    if until_ns is not None:
        query = query.where(col(point.time_ns) < until_ns + CLOCK_SLACK_NS)
    return query.order_by(col(point.time_ns).desc(), col(point.id).desc())


def _vllm_cached(
    connection: Connection, since_ns: int | None, until_ns: int | None
) -> dict[tuple[str, str], list[tuple[int, str, int]]]:
    """vLLM's own cached-token counts (timeline points of update_state_after_alloc) per
    (engine, request): (time, point, tokens), newest first (a dict of them keeps the first)."""
    found: dict[tuple[str, str], list[tuple[int, str, int]]] = {}
    for engine_id, request_id, time_ns, name, value in connection.execute(
        cached_tokens_query(since_ns, until_ns)
    ):
        found.setdefault((engine_id, request_id), []).append((time_ns, name, value))
    return found
