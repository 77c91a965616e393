"""Keeps the database bounded: drops spans beyond the count or age limit, and what they fed."""

from sqlalchemy import Connection, and_, delete, func, select

from kvscope.backend.models import Block, Failure, Lease, Request, Span, TimelinePoint, Transfer

MAX_AGE_S = 1e11
"""Longer than anything a signed 64-bit nanosecond time can hold back from now."""


def prune(connection: Connection, max_spans: int, max_age_s: float, now_ns: int) -> int:
    """Deletes the oldest spans beyond either limit; returns how many spans went."""
    spans = Span.__table__
    # Clamped to what a 64-bit column can compare with (an age may be set to 'inf').
    cutoff_ns = max(0, now_ns - int(min(max_age_s, MAX_AGE_S) * 1e9))
    removed = connection.execute(delete(spans).where(spans.c.start_ns < cutoff_ns)).rowcount
    # Spans are numbered in arrival order: keep the newest max_spans ids. The OFFSET walks
    # the rows it skips, so it runs only when the id range shows there may be too many.
    low, high = connection.execute(select(func.min(spans.c.id), func.max(spans.c.id))).one()
    threshold = None
    if low is not None and high - low + 1 > max_spans:
        threshold = connection.execute(
            select(spans.c.id).order_by(spans.c.id.desc()).offset(max_spans).limit(1)
        ).scalar()
    if threshold is not None:
        removed += connection.execute(delete(spans).where(spans.c.id <= threshold)).rowcount
    if removed:
        oldest = connection.execute(select(func.min(spans.c.start_ns))).scalar()
        _prune_derived(connection, max(cutoff_ns, oldest or now_ns))
    return removed


def _prune_derived(connection: Connection, before_ns: int) -> None:
    """Rows derived from spans that are gone; current block and lease state stays."""
    for table, column in (
        (TimelinePoint.__table__, "time_ns"),
        (Transfer.__table__, "start_ns"),
        (Failure.__table__, "time_ns"),
    ):
        connection.execute(delete(table).where(table.c[column] < before_ns))
    requests = Request.__table__
    connection.execute(
        delete(requests).where(and_(requests.c.end_ns.is_not(None), requests.c.end_ns < before_ns))
    )
    leases = Lease.__table__
    connection.execute(
        delete(leases).where(and_(leases.c.ended_ns.is_not(None), leases.c.ended_ns < before_ns))
    )
    blocks = Block.__table__
    connection.execute(
        delete(blocks).where(and_(blocks.c.state == "evicted", blocks.c.updated_ns < before_ns))
    )
