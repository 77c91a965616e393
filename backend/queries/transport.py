"""P2P reads with the transport NIXL and UCX really used, their rate against that path's, flags."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from sqlmodel import Session, col, select

from kvscope.backend.db.models import Span, Transfer
from kvscope.backend.queries.transport_rates import (
    ABOVE_LINE_RATE,
    DEFAULT_RATES_GBPS,
    TCP_STAGED,
    UNDER_1_GBPS,
    judge,
)
from kvscope.traces import names

P2P_READ = "p2p_read"
MAX_READS = 2000
"""The most reads one answer judges: its cost is bounded by these rows, whatever the window."""


class TransportRead(BaseModel):
    """One P2P read: bytes and time of one window, the path NIXL/UCX used, its rate judged."""

    request_id: str | None
    engine_id: str | None
    peer: str | None
    ok: bool
    start_ns: int
    end_ns: int
    bytes: int
    duration_ms: float
    gbps: float
    window: str  # 'post_to_done', or 'unknown' for spans from before kvscope said
    backend: str  # NIXL's backend ('UCX') or 'unknown'
    ucx_lanes: list[str]
    ucx_control_lanes: list[str]
    ucx_scope: str
    memory: str
    nixl_bytes: int | None
    nixl_xfer_us: int | None
    families: list[str]
    expected_gbps: float | None
    line_gbps: float | None
    flags: list[str]


class TransportSummary(BaseModel):
    """The window's P2P reads: how many, which lanes, and how many raised each flag."""

    reads: int
    bytes: int
    truncated: bool  # more reads than MAX_READS: the counts are of the newest ones
    lanes: dict[str, int]  # 'cma/memory' -> reads over it ('unknown' where UCX did not say)
    flags: dict[str, int]  # tcp_staged / under_1gbps / above_line_rate -> reads
    flagged_requests: dict[str, list[str]]  # flag -> up to 5 request ids
    warnings: list[str]  # in words, for the overview


def reads(
    session: Session,
    since_ns: int,
    until_ns: int | None = None,
    engine_id: str | None = None,
    request_nos: Any = None,
    rates: dict[str, tuple[float, float]] = DEFAULT_RATES_GBPS,
    limit: int = MAX_READS,
) -> list[TransportRead]:
    """The newest P2P reads that started in the window (or of these request numbers)."""
    query = select(Transfer).where(Transfer.direction == P2P_READ, Transfer.start_ns >= since_ns)
    if until_ns is not None:
        query = query.where(Transfer.start_ns < until_ns)
    if engine_id is not None:
        query = query.where(Transfer.engine_id == engine_id)
    if request_nos is not None:
        query = query.where(col(Transfer.request_no).in_(request_nos))
    transfers = session.exec(query.order_by(col(Transfer.start_ns).desc()).limit(limit)).all()
    spans = _spans_of(session, transfers)
    return [_judged(t, spans.get((t.trace_id, t.span_id), {}), rates) for t in transfers]


def _spans_of(session: Session, transfers) -> dict[tuple[str, str], dict]:
    """Each transfer's span attributes, by the span's own key (led by its start time)."""
    if not transfers:
        return {}
    query = select(Span.trace_id, Span.span_id, Span.attributes).where(
        col(Span.start_ns).in_({t.start_ns for t in transfers}),
        col(Span.span_id).in_({t.span_id for t in transfers}),
        Span.name == names.SPAN_TRANSFER,
    )
    return {(trace, span): json.loads(attrs) for trace, span, attrs in session.exec(query)}


def _judged(transfer: Transfer, attrs: dict, rates) -> TransportRead:
    lanes = list(attrs.get(names.TRANSPORT_UCX_LANES) or [])
    scope = attrs.get(names.TRANSPORT_UCX_SCOPE, "unknown")
    memory = attrs.get(names.TRANSPORT_MEMORY, "unknown")
    duration_ms = (transfer.end_ns - transfer.start_ns) / 1e6
    num_bytes = transfer.bytes or 0
    gbps = num_bytes / (duration_ms * 1e6) if duration_ms > 0 else 0.0  # one window: the span's
    path = judge(lanes, scope, memory, num_bytes, gbps, rates)
    return TransportRead(
        request_id=transfer.request_id,
        engine_id=transfer.engine_id,
        peer=transfer.peer,
        ok=transfer.ok,
        start_ns=transfer.start_ns,
        end_ns=transfer.end_ns,
        bytes=num_bytes,
        duration_ms=duration_ms,
        gbps=gbps,
        window=attrs.get(names.TRANSPORT_WINDOW, "unknown"),
        backend=attrs.get(names.TRANSPORT_BACKEND, "unknown"),
        ucx_lanes=lanes,
        ucx_control_lanes=list(attrs.get(names.TRANSPORT_UCX_CONTROL_LANES) or []),
        ucx_scope=scope,
        memory=memory,
        nixl_bytes=attrs.get(names.TRANSPORT_NIXL_BYTES),
        nixl_xfer_us=attrs.get(names.TRANSPORT_NIXL_XFER_US),
        families=path.families,
        expected_gbps=path.expected_gbps,
        line_gbps=path.line_gbps,
        flags=path.flags if transfer.ok else [],
    )


_WORDS = {
    TCP_STAGED: "went over TCP although a faster lane should exist (same host, or GPU memory)",
    UNDER_1_GBPS: "moved under 1 GB/s (reads of 1 MiB or more)",
    ABOVE_LINE_RATE: "beat their path's line rate: bytes and time from different windows",
}


def summarize(judged: list[TransportRead], truncated: bool) -> TransportSummary:
    """Counts of the reads' lanes and flags, and a warning in words per flag raised."""
    lanes: dict[str, int] = {}
    flags = {flag: 0 for flag in _WORDS}
    flagged: dict[str, list[str]] = {flag: [] for flag in _WORDS}
    flagged_lanes: dict[str, set[str]] = {flag: set() for flag in _WORDS}
    for read in judged:
        for lane in read.ucx_lanes or ["unknown"]:
            lanes[lane] = lanes.get(lane, 0) + 1
        for flag in read.flags:
            flags[flag] += 1
            flagged_lanes[flag].update(read.ucx_lanes or ["unknown"])
            if read.request_id and len(flagged[flag]) < 5:
                flagged[flag].append(read.request_id)
    warnings = [
        f"P2P transport: {count} of {len(judged)} reads {_WORDS[flag]}; UCX lanes: "
        f"{', '.join(sorted(flagged_lanes[flag]))}."
        for flag, count in flags.items()
        if count
    ]
    return TransportSummary(
        reads=len(judged),
        bytes=sum(r.bytes for r in judged),
        truncated=truncated,
        lanes=lanes,
        flags=flags,
        flagged_requests={flag: ids for flag, ids in flagged.items() if ids},
        warnings=warnings,
    )
