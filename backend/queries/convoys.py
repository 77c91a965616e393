"""Load convoys per engine over a window: loads that queued behind another request's load of the
same host blocks (connector/cpu_offload/convoys.py), counted with the time they waited.

Each convoy is a load_convoy timeline point whose span lasts the wait. Both reads are range
scans of the points' time-led key over the window, joined to their spans by the spans'
time-led key: bounded by the window's rows.
"""

import json

from pydantic import BaseModel, Field
from sqlalchemy import Connection, select, text
from sqlmodel import col

from kvscope.backend.db.models import Request
from kvscope.backend.db.request_numbers import numbers_of
from kvscope.traces import names

MAX_ITEMS = 50
"""Newest convoys listed (the per-engine rows count them all)."""

# The literal point name lets SQLite keep to the time range of the point key.
_FROM = (
    "FROM timelinepoint AS point JOIN span ON span.start_ns = point.time_ns "
    "AND span.trace_id = point.trace_id AND span.span_id = point.span_id "
    "LEFT JOIN process ON process.instance_id = span.instance_id "
    "WHERE point.time_ns >= :since AND point.time_ns < :until "
    f"AND point.point = '{names.LOAD_CONVOY_POINT}' "
)
_ENGINE = "COALESCE(point.engine_id, span.engine_id, process.engine_id, span.instance_id, '')"
_PER_ENGINE = text(
    f"SELECT {_ENGINE} AS engine, COUNT(*), COUNT(DISTINCT point.request_no), "
    "SUM(span.end_ns - span.start_ns), MAX(span.end_ns - span.start_ns) "
    f"{_FROM} GROUP BY engine ORDER BY COUNT(*) DESC, engine"
)
_NEWEST = text(
    f"SELECT {_ENGINE}, point.request_id, point.time_ns, "
    f"span.end_ns - span.start_ns, span.attributes {_FROM} "
    "ORDER BY point.time_ns DESC LIMIT :limit"
)


class EngineConvoys(BaseModel):
    """One engine's loads that waited behind another request's load of the same blocks."""

    engine_id: str
    convoys: int = Field(description="loads that queued behind a load of the same host blocks")
    requests: int = Field(description="distinct requests among them")
    wait_ms_total: float
    wait_ms_max: float


class ConvoyItem(BaseModel):
    """One load that waited: whose, behind whom, how long."""

    id: int | None = Field(description="the request row's id: the Requests page opens it")
    engine_id: str
    request_id: str | None
    leader_request_id: str | None = Field(description="whose load it queued behind")
    time_ns: int = Field(description="the load's submission: where the wait began")
    wait_ms: float
    loads_ahead: int | None
    shared_blocks: int | None
    shared_load: bool = Field(description="held back until the leader's load served it")


class ConvoysPublic(BaseModel):
    window_s: float | None
    since_ns: int
    until_ns: int
    convoys: int
    wait_ms_total: float
    engines: list[EngineConvoys]
    items: list[ConvoyItem] = Field(description=f"the newest {MAX_ITEMS} convoys")


def load_convoys(
    connection: Connection, since_ns: int, until_ns: int, window_s: float | None = None
) -> ConvoysPublic:
    """Convoys whose wait began in [since_ns, until_ns), per engine, and the newest ones."""
    window = {"since": since_ns, "until": until_ns}
    engines = [
        EngineConvoys(
            engine_id=engine,
            convoys=count,
            requests=requests,
            # PostgreSQL sums bigints as numeric (a Decimal here): int() for both databases.
            wait_ms_total=int(total_ns or 0) / 1e6,
            wait_ms_max=int(max_ns or 0) / 1e6,
        )
        for engine, count, requests, total_ns, max_ns in connection.execute(_PER_ENGINE, window)
    ]
    newest = connection.execute(_NEWEST, window | {"limit": MAX_ITEMS}).all()
    return ConvoysPublic(
        window_s=window_s,
        since_ns=since_ns,
        until_ns=until_ns,
        convoys=sum(row.convoys for row in engines),
        wait_ms_total=sum(row.wait_ms_total for row in engines),
        engines=engines,
        items=[_item(connection, *row) for row in newest],
    )


def _item(connection, engine, request_id, time_ns, wait_ns, attributes) -> ConvoyItem:
    found = json.loads(attributes) if isinstance(attributes, str) else dict(attributes or {})
    row_id = None
    if request_id is not None:  # the worker's points may name no engine: its request's row does
        numbers = numbers_of(request_id, (engine, ""))
        query = select(col(Request.id)).where(col(Request.request_no).in_(numbers))
        row_id = connection.execute(query.order_by(col(Request.id).desc()).limit(1)).scalar()
    return ConvoyItem(
        id=row_id,
        engine_id=engine,
        request_id=request_id,
        leader_request_id=found.get(names.CONVOY_LEADER),
        time_ns=time_ns,
        wait_ms=wait_ns / 1e6,
        loads_ahead=found.get(names.CONVOY_LOADS_AHEAD),
        shared_blocks=found.get(names.CONVOY_SHARED_BLOCKS),
        shared_load=bool(found.get(names.CONVOY_SHARED_LOAD)),
    )
