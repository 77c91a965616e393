"""Which derived state the backend can vouch for, given the seq holes of each process."""

import time
from collections.abc import Iterable

from sqlmodel import Session

from kvscope.backend.db import seqs
from kvscope.backend.queries.schemas import Certainty, GapPublic


def gaps(
    session: Session,
    grace_s: float,
    origins: Iterable[str] | None = None,
    now_ns: int | None = None,
) -> list[GapPublic]:
    """Holes of the given processes (all when None), oldest process first."""
    wanted = None if origins is None else set(origins)
    found = seqs.holes(session.connection(), now_ns or time.time_ns(), grace_s)
    return [
        GapPublic(
            origin=h.origin,
            first=h.first,
            last=h.last,
            count=h.count,
            after_ns=h.after_ns,
            before_ns=h.before_ns,
            age_s=round(h.age_s, 3),
            state=h.state,
        )
        for h in found
        if wanted is None or h.origin in wanted
    ]


def certainty(session: Session, grace_s: float, origins: Iterable[str] | None = None) -> Certainty:
    found = gaps(session, grace_s, origins)
    return Certainty(complete=not found, gaps=found)


def uncertain_reasons(found: list[GapPublic]) -> dict[str, str]:
    """Per process with holes: why state built from its spans may be stale."""
    reasons: dict[str, list[str]] = {}
    for gap in found:
        span = f"seq {gap.first}" if gap.count == 1 else f"seq {gap.first}..{gap.last}"
        reasons.setdefault(gap.origin, []).append(f"{span} {gap.state}")
    return {
        origin: (
            f"spans of process {origin} not received ({', '.join(parts[:3])}"
            f"{', ...' if len(parts) > 3 else ''}): a missing span may have changed this"
        )
        for origin, parts in reasons.items()
    }
