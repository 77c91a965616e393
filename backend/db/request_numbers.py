"""Request numbers: one integer per (engine, request id), given as requests are first seen.

vLLM's request ids are random ('cmpl-', a UUID, the engine's 8 random characters): an index led
by them takes each request's rows at a random place, a page written per request per batch, and
once it outgrows the page cache a page read too. A 512-span batch of 51 requests wrote 954 WAL
frames with such ids against 368 with ids that grow. So the writer numbers each (engine,
request id) it has not seen before, batch by batch, and every row derived from a request (its
spans, timeline points, transfers, failures, lookups and request rows) carries that number,
indexed in place of the request id: a batch's rows land beside each other. One random index
is left, this table's, probed once per request per batch. Rows without an engine are numbered
under '' (a unique key holds NULLs distinct). Readers go from a request id to its numbers
(numbers_of) and read by number; the rollup triggers match a request's rows by number.
"""

import json
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, Select, and_, or_, select, text

from kvscope.backend.db import read_schema, rollups
from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.models import RequestNumber

NUMBERED = {
    # table: the indexes by request id that its index by number replaced (migration 12)
    "span": ("ix_span_request_id",),
    "timelinepoint": ("ix_point_request",),
    "transfer": ("ix_transfer_request_id",),
    "failure": ("ix_failure_request",),
    "lookup": ("ix_lookup_request",),
    "kv_request": ("ix_kv_request_request_id", "ix_request_request_engine"),
}
"""The tables whose rows carry their request's number."""

UNREAD = ("ix_latency_request",)
"""Indexes by request id no query reads (vLLM's latencies are read by time), dropped by 12."""

COLUMN = "request_no"

Pair = tuple[str, str]
"""(engine_id or '', request_id)"""

_NUMBERS = "SELECT id, engine_id, request_id FROM request_number WHERE request_id IN ({ids})"
_IDS = {False: "SELECT value FROM json_each(?)", True: "SELECT unnest(CAST(? AS text[]))"}


def assign(writer: BulkCursor, pairs: Iterable[Pair]) -> dict[Pair, int]:
    """The numbers of these pairs, new ones given, a batch's consecutive. In sorted order, as
    every writer takes them: two backends numbering the same requests on PostgreSQL wait for
    each other, never in a cycle."""
    wanted = sorted(set(pairs))
    if not wanted:
        return {}
    writer.insert(RequestNumber.__table__, ("engine_id", "request_id"), wanted)
    requests = sorted({request_id for _, request_id in wanted})
    sql = _NUMBERS.format(ids=_IDS[writer.postgres])
    found = writer.execute(sql, (requests if writer.postgres else json.dumps(requests),))
    numbers = {(engine_id, request_id): number for number, engine_id, request_id in found}
    return {pair: numbers[pair] for pair in wanted}


def numbered(
    rows: Sequence[tuple], engine_at: int, request_at: int, numbers: dict[Pair, int]
) -> list[tuple]:
    """Tuple rows with their request's number appended (None for rows of no request)."""
    out = []
    for row in rows:
        request_id = row[request_at]
        number = None if request_id is None else numbers[row[engine_at] or "", request_id]
        out.append((*row, number))
    return out


def number_dicts(rows: list[dict], numbers: dict[Pair, int]) -> None:
    """Dict rows get their request's number, in place."""
    for row in rows:
        request_id = row["request_id"]
        row[COLUMN] = None if request_id is None else numbers[(row["engine_id"] or "", request_id)]


def numbers_of(request_id: str | Sequence[str], engines: Sequence[str] | None = None) -> Select:
    """The numbers of a request id (or of any of several), on the given engines ('' for rows
    without one) or on any."""
    query = select(RequestNumber.id)
    if isinstance(request_id, str):
        query = query.where(RequestNumber.request_id == request_id)
    else:
        query = query.where(RequestNumber.request_id.in_(request_id))
    return query if engines is None else query.where(RequestNumber.engine_id.in_(engines))


def numbers_of_pairs(pairs: Iterable[Pair]) -> Select:
    """The numbers of these (engine, request id) pairs."""
    return select(RequestNumber.id).where(
        or_(
            *(
                and_(RequestNumber.engine_id == engine, RequestNumber.request_id == request_id)
                for engine, request_id in pairs
            )
        )
    )


_LOWEST_NUMBERS = tuple(text(f"SELECT MIN({COLUMN}) FROM {table}") for table in NUMBERED)
_NUMBERS_BELOW = text(
    "DELETE FROM request_number WHERE id IN "
    "(SELECT id FROM request_number WHERE id < :below ORDER BY id LIMIT :batch)"
)


def prune(connection: Connection, batch: int) -> bool:
    """Retention: drops up to `batch` numbers below the lowest any stored row still carries
    (numbers grow as requests come, and retention drops rows oldest first). True if more
    are left. A request older than every stored row that comes back is numbered anew."""
    lowest = [connection.execute(statement).scalar() for statement in _LOWEST_NUMBERS]
    carried = [number for number in lowest if number is not None]
    if not carried:
        return False  # nothing numbered is stored, or a writer's first rows are on their way
    gone = connection.execute(_NUMBERS_BELOW, {"below": min(carried), "batch": batch}).rowcount
    return gone >= batch


def migrate(connection: Connection) -> None:
    """Migration 12: the number table and columns, every stored row numbered, the indexes by
    request id replaced by indexes by number, the rollup triggers installed again (they match
    a request's rows by number). One pass over each table, once."""
    read_schema.add_missing(connection)
    for table, old_indexes in NUMBERED.items():
        connection.execute(
            text(
                "INSERT INTO request_number (engine_id, request_id) "
                f"SELECT DISTINCT COALESCE(engine_id, ''), request_id FROM {table} "
                "WHERE request_id IS NOT NULL ON CONFLICT DO NOTHING"
            )
        )
        connection.execute(
            text(
                f"UPDATE {table} SET {COLUMN} = (SELECT n.id FROM request_number n "
                f"WHERE n.request_id = {table}.request_id "
                f"AND n.engine_id = COALESCE({table}.engine_id, '')) "
                "WHERE request_id IS NOT NULL"
            )
        )
        for index in old_indexes:
            connection.execute(text(f"DROP INDEX IF EXISTS {index}"))
    for index in UNREAD:
        connection.execute(text(f"DROP INDEX IF EXISTS {index}"))
    rollups.install(connection)
