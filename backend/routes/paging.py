"""Shared query helpers for list routes: paging parameters and a counted page."""

from typing import Annotated

from fastapi import Path, Query
from sqlmodel import Session, func, select

from kvscope.backend.db.request_numbers import numbers_of

MAX_INT64 = 2**63 - 1
"""Databases store 64-bit integers: a larger number in a query is a 422, not a crash."""

Offset = Annotated[int, Query(ge=0, le=MAX_INT64, description="rows to skip")]
Limit = Annotated[int, Query(ge=1, le=1000, description="rows to return")]
SinceNs = Annotated[
    int | None,
    Query(ge=-MAX_INT64, le=MAX_INT64, description="only rows at or after this time (ns)"),
]
UntilNs = Annotated[
    int | None, Query(ge=-MAX_INT64, le=MAX_INT64, description="only rows before this time (ns)")
]
# Row ids are 64-bit (BIGSERIAL, SQLite's rowid): a larger id cannot exist, so it is a 422.
RowId = Annotated[int, Path(ge=0, le=MAX_INT64, description="the row's id")]
WindowS = Annotated[
    float,
    Query(
        gt=0,
        le=100 * 365 * 24 * 3600,
        allow_inf_nan=False,
        description="seconds back from now (at most a century)",
    ),
]


def page(session: Session, query, offset: int, limit: int) -> dict:
    """The query's rows in [offset, offset+limit) and how many rows match in all."""
    total = session.exec(select(func.count()).select_from(query.subquery())).one()
    items = session.exec(query.offset(offset).limit(limit)).all()
    return {"items": items, "total": total, "offset": offset, "limit": limit}


def in_window(query, column, since_ns: int | None, until_ns: int | None):
    if since_ns is not None:
        query = query.where(column >= since_ns)
    if until_ns is not None:
        query = query.where(column < until_ns)
    return query


def equal(query, **filters):
    """Adds column == value for every filter given (None means no filter)."""
    model = query.column_descriptions[0]["entity"]
    for name, value in filters.items():
        if value is not None:
            query = query.where(getattr(model, name) == value)
    return query


def of_request_id(query, request_id: str | None):
    """Rows of a request id on any engine, found by their request numbers (request_numbers)."""
    if request_id is None:
        return query
    model = query.column_descriptions[0]["entity"]
    return query.where(model.request_no.in_(numbers_of(request_id)))
