"""One request's prompt tokens not served from a tier, by reason: they add up, or say why not."""

from pydantic import BaseModel, Field

from kvscope.backend.queries.accounting import CLOCK_SLACK_NS, RequestAccount
from kvscope.backend.queries.misses import vocabulary as why
from kvscope.backend.queries.misses.walk import EngineWalk, LookedUp


class MissedTokens(BaseModel):
    """Tokens of one request that missed for one reason (a run of blocks, where it has one)."""

    reason: str
    tokens: int
    first_block: int | None = None
    blocks: int | None = None
    evicted_before_lookup_s: float | None = None
    diverged_at_block: int | None = None


class RequestMisses(BaseModel):
    id: int = Field(description="the request row's id: the Requests page opens ?request=<id>")
    request_id: str
    engine_id: str
    end_ns: int
    prompt_tokens: int
    served_tokens: int = Field(description="prompt tokens a tier served (its loads succeeded)")
    missed_tokens: int = Field(description="prompt tokens minus served: what the reasons add to")
    reasons: list[MissedTokens]
    violation: str | None = Field(description="why the reasons do not add up (None: they do)")


def explain(account: RequestAccount, walk: EngineWalk | None, failed: bool) -> RequestMisses:
    """The request's tokens by reason, from its accounted lookup (vLLM's prefix cache and the
    tiers' hits), the host pool's lookup at that time (why each block missed) and whether its
    load failed. The whole blocks past the local hit that no tier served are explained block
    by block when the host pool recorded the lookup."""
    prompt, local = account.prompt_tokens, account.local_hit_tokens
    hit = sum(account.external_hit_tokens.values())
    looked_up = _lookup_of(account, walk)
    block_size = looked_up.block_size if looked_up else (walk.block_size if walk else 0)
    reasons: list[MissedTokens] = [MissedTokens(reason=why.LOCAL, tokens=local)]
    rest = prompt - local - hit
    if block_size:  # a peer may serve part of a block: what is left of it is partial too
        whole_end = max((prompt - 1) // block_size * block_size, local)
        partial = max(0, min(prompt - whole_end, rest))
        reasons.append(MissedTokens(reason=why.PARTIAL, tokens=partial))
        rest -= partial
    violation = None
    if failed and hit:
        reasons.append(MissedTokens(reason=why.LOAD_FAILED, tokens=hit))
    host_served = account.external_hit_tokens.get("host", 0) == hit
    if looked_up is not None and host_served:
        explained = _runs(looked_up)
        told = sum(r.tokens for r in explained)
        if told != rest:
            violation = (
                f"the host pool's lookup explains {told} missed tokens "
                f"({looked_up.asked_blocks} blocks asked, {looked_up.hit_blocks} hit), "
                f"the accounting leaves {rest}"
            )
        reasons.extend(explained)
        rest -= told
    elif walk is not None and _skipped(account, walk):
        reasons.append(MissedTokens(reason=why.BYPASSED, tokens=max(rest, 0)))
        rest = min(rest, 0)
    if rest:
        reasons.append(MissedTokens(reason=why.NOT_OFFERED, tokens=rest))
    served = 0 if failed else hit
    kept = [r for r in reasons if r.tokens]
    if violation is None and sum(r.tokens for r in kept) != prompt - served:
        violation = f"the reasons add up to {sum(r.tokens for r in kept)}, not {prompt - served}"
    if violation is None and any(r.tokens < 0 for r in kept):
        violation = "a reason counts negative tokens: the hits exceed the prompt"
    return RequestMisses(
        id=account.id,
        request_id=account.request_id,
        engine_id=account.engine_id,
        end_ns=account.end_ns,
        prompt_tokens=prompt,
        served_tokens=served,
        missed_tokens=prompt - served,
        reasons=kept,
        violation=violation,
    )


def _lookup_of(account: RequestAccount, walk: EngineWalk | None) -> LookedUp | None:
    """The host pool's last lookup for the request up to its accounted one."""
    if walk is None:
        return None
    found = [
        lookup
        for lookup in walk.lookups.get(account.request_id, ())
        if lookup.time_ns <= account.lookup_ns + CLOCK_SLACK_NS
    ]
    return found[-1] if found else None


def _skipped(account: RequestAccount, walk: EngineWalk) -> bool:
    return any(
        time_ns <= account.lookup_ns + CLOCK_SLACK_NS
        for time_ns in walk.skipped.get(account.request_id, ())
    )


def _runs(looked_up: LookedUp) -> list[MissedTokens]:
    size = looked_up.block_size
    return [
        MissedTokens(
            reason=run.reason,
            tokens=run.blocks * size,
            first_block=run.first_block,
            blocks=run.blocks,
            evicted_before_lookup_s=(
                None if run.evicted_ns is None else (looked_up.time_ns - run.evicted_ns) / 1e9
            ),
            diverged_at_block=run.diverged_at_block,
        )
        for run in looked_up.runs
    ]
