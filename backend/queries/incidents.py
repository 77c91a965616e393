"""Failure reports folded into incidents: one fault is one row with its chain of reports.

One injected fault reaches the backend as up to four reports: the failed transfer, the
child connector's load failure (the real cause), the MultiConnector's decision (fallback or
policy) and vLLM's view of the blocks it must recompute (which names no request). They are
one incident: same engine and request (a report without a request: overlapping block ids,
else the same engine within a second), close in time. The incident's cause is the first
specific one, its outcome the last reported (else what its policy implies).
"""

import json
from collections.abc import Iterable

from pydantic import BaseModel

from kvscope.backend.db.models import FailurePublic as Failure
from kvscope.traces.outcomes import outcome_of_policy

SAME_INCIDENT_NS = 10 * 10**9
"""Reports further apart than this (10 s) are separate incidents, even for one request."""

NEARBY_NS = 10**9
"""A report naming neither request nor known blocks joins its engine's incident this close."""

GENERIC_CAUSES = {None, "", "load_error"}
"""Causes that only say 'a load failed': a report with a specific cause explains it better."""

_KIND_RANK = {"load_failed": 0, "transfer_failed": 1, "lease_expired": 2}


class ChainStep(BaseModel):
    time_ns: int
    kind: str
    cause: str | None
    policy: str | None
    outcome: str | None
    child: str | None
    fallback_child: str | None


class IncidentPublic(BaseModel):
    """One failure incident: cause -> policy -> outcome, and the reports it folds in."""

    id: int
    time_ns: int
    last_ns: int
    kind: str
    cause: str | None
    policy: str | None
    outcome: str | None
    outcome_inferred: bool  # no report said; vLLM's policy implies it
    request_id: str | None
    engine_id: str | None
    lease_id: str | None
    failed_child: str | None
    fallback_child: str | None
    block_ids: list[int]
    reports: int
    chain: list[ChainStep]


def _blocks(failure: Failure) -> set[int]:
    return set(json.loads(failure.block_ids)) if failure.block_ids else set()


class _Open:
    """An incident being folded: its reports so far."""

    def __init__(self, first: Failure) -> None:
        self.reports = [first]
        self.blocks = _blocks(first)

    def takes(self, failure: Failure, nearby: bool = False) -> bool:
        """Same engine, close in time, and the same request (or its blocks, or just nearby)."""
        last = self.reports[-1]
        if failure.engine_id != last.engine_id or failure.time_ns - last.time_ns > SAME_INCIDENT_NS:
            return False
        if failure.request_id is not None:
            return failure.request_id == self.request_id
        if nearby:
            return failure.time_ns - last.time_ns <= NEARBY_NS
        return bool(_blocks(failure) & self.blocks)

    @property
    def request_id(self) -> str | None:
        return next((r.request_id for r in self.reports if r.request_id), None)

    def add(self, failure: Failure) -> None:
        self.reports.append(failure)
        self.blocks |= _blocks(failure)


def fold(failures: Iterable[Failure]) -> list[IncidentPublic]:
    """Incidents of the given reports, newest first."""
    open_: list[_Open] = []
    for failure in sorted(failures, key=lambda f: (f.time_ns, f.id or 0)):
        # A report with a request joins that request's incident; one without joins the
        # incident whose blocks it names. Recent incidents first: the scan stays short.
        home = next((o for o in reversed(open_) if o.takes(failure)), None)
        if home is None and failure.request_id is None:
            home = next((o for o in reversed(open_) if o.takes(failure, nearby=True)), None)
        if home is None:
            open_.append(_Open(failure))
        else:
            home.add(failure)
    return sorted((_public(o) for o in open_), key=lambda i: (-i.time_ns, -i.id))


def _first(values: Iterable):
    return next((v for v in values if v), None)


def _public(incident: _Open) -> IncidentPublic:
    reports = incident.reports
    specific = [r.cause for r in reports if r.cause not in GENERIC_CAUSES]
    kind = min((r.kind for r in reports), key=lambda k: _KIND_RANK.get(k, 9))
    policy = _first(r.policy for r in reversed(reports))
    outcome = _first(r.outcome for r in reversed(reports))
    inferred = outcome is None and policy in ("recompute", "fail")
    return IncidentPublic(
        id=min(r.id or 0 for r in reports),
        time_ns=reports[0].time_ns,
        last_ns=reports[-1].time_ns,
        kind=kind,
        cause=_first(specific) or _first(r.cause for r in reports) or kind,
        policy=policy,
        outcome=outcome_of_policy(policy) if inferred else outcome,
        outcome_inferred=inferred,
        request_id=incident.request_id,
        engine_id=reports[0].engine_id,
        lease_id=_first(r.lease_id for r in reports),
        failed_child=_first(r.child for r in reports),
        fallback_child=_first(r.fallback_child for r in reversed(reports)),
        block_ids=sorted(incident.blocks),
        reports=len(reports),
        chain=[
            ChainStep(
                time_ns=r.time_ns,
                kind=r.kind,
                cause=r.cause,
                policy=r.policy,
                outcome=r.outcome,
                child=r.child,
                fallback_child=r.fallback_child,
            )
            for r in reports
        ],
    )
