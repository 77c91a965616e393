"""Request numbers: one integer per (engine, request id), given as requests are first seen.

vLLM's request ids are random ('cmpl-', a UUID, the engine's 8 random characters): an index led
by them takes each request's rows at a random place, a page written per request per batch, and
once it outgrows the page cache a page read too. A 512-span batch of 51 requests wrote 954 WAL
frames with such ids against 368 with ids that grow. So the writer numbers each (engine,
request id) it has not seen before, batch by batch, and every row derived from a request (its
spans, timeline points, transfers, failures, lookups and request rows) carries that number,
indexed in place of the request id: a batch's rows land beside each other. The request table's
unique key is led by it too (a row of no request id carries NO_REQUEST). One random index is
left, this table's, probed once per request per batch: a 64-bit hash of the request id, a
quarter of an index of the ids themselves, the id compared after. Rows without an engine are
numbered under ''. Readers go from a request id to its numbers (numbers_of) and read by number;
the rollup triggers match a request's rows by number. Migrations 12 and 13 number an older
database's rows (backend/db/number_keys.py).
"""

import hashlib
import json
from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, Select, and_, or_, select, text
from sqlmodel import col

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

COLUMN = "request_no"

NO_REQUEST = 0
"""The number of a request row of no request id: the request table's unique key is led by the
number, and a NULL would make an exporter's retry of such a row a second row. Numbers start
at 1."""

Pair = tuple[str, str]
"""(engine_id or '', request_id)"""


def request_hash(request_id: str) -> int:
    """The request id's 64-bit key: the first 8 bytes of its MD5, signed, as hash_sql computes
    it in SQL (a key, not a secret: any well-spread hash would do, and PostgreSQL has MD5)."""
    digest = hashlib.md5(request_id.encode("utf-8", "surrogatepass"), usedforsecurity=False)
    return int.from_bytes(digest.digest()[:8], "big", signed=True)


_HASH_FUNCTION = "kvscope_request_hash"


def hash_sql(connection: Connection, column: str) -> str:
    """SQL of request_hash(column), for migrations: PostgreSQL computes it, SQLite calls this
    module's function (registered on the connection)."""
    if connection.dialect.name == "postgresql":
        return f"('x' || left(md5({column}), 16))::bit(64)::bigint"
    driver = connection.connection.driver_connection
    assert driver is not None  # a connection in use holds its driver's connection
    driver.create_function(_HASH_FUNCTION, 1, request_hash, deterministic=True)
    return f"{_HASH_FUNCTION}({column})"


# A pair not numbered yet is added; the check and the insert are one statement, which on
# SQLite holds the write lock from its start. On PostgreSQL the writer holds its requests'
# locks (backend/db/request_locks.py): two backends numbering one request take turns.
_ADD = (
    "INSERT INTO request_number (request_hash, engine_id, request_id) "
    "SELECT w.h, w.e, w.r FROM {pairs} WHERE NOT EXISTS (SELECT 1 FROM request_number n "
    "WHERE n.request_hash = w.h AND n.request_id = w.r AND n.engine_id = w.e)"
)
_PAIRS = {
    False: "(SELECT json_extract(value, '$[0]') AS h, json_extract(value, '$[1]') AS e, "
    "json_extract(value, '$[2]') AS r FROM json_each(?)) AS w",
    True: "unnest(CAST(? AS bigint[]), CAST(? AS text[]), CAST(? AS text[])) AS w(h, e, r)",
}
_NUMBERS = "SELECT id, engine_id, request_id FROM request_number WHERE request_hash IN ({hashes})"
_HASHES = {False: "SELECT value FROM json_each(?)", True: "SELECT unnest(CAST(? AS bigint[]))"}


def assign(writer: BulkCursor, pairs: Iterable[Pair]) -> dict[Pair, int]:
    """The numbers of these pairs, new ones given, a batch's consecutive, in sorted order."""
    wanted = sorted(set(pairs))
    if not wanted:
        return {}
    hashes = [request_hash(request_id) for _, request_id in wanted]
    engines = [engine_id for engine_id, _ in wanted]
    request_ids = [request_id for _, request_id in wanted]
    add = _ADD.format(pairs=_PAIRS[writer.postgres])
    if writer.postgres:
        writer.execute(add, (hashes, engines, request_ids))
        found = writer.execute(_NUMBERS.format(hashes=_HASHES[True]), (sorted(set(hashes)),))
    else:
        writer.execute(add, (json.dumps(list(zip(hashes, engines, request_ids, strict=True))),))
        found = writer.execute(_NUMBERS.format(hashes=_HASHES[False]), (json.dumps(hashes),))
    # Other requests whose ids share a hash come too: the ids tell them apart.
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


def number_dicts(rows: list[dict], numbers: dict[Pair, int], absent: int | None = None) -> None:
    """Dict rows get their request's number, in place (`absent` for rows of no request id)."""
    for row in rows:
        request_id = row["request_id"]
        row[COLUMN] = (
            absent if request_id is None else numbers[(row["engine_id"] or "", request_id)]
        )


def numbers_of(request_id: str | Sequence[str], engines: Sequence[str] | None = None) -> Select:
    """The numbers of a request id (or of any of several), on the given engines ('' for rows
    without one) or on any."""
    ids = [request_id] if isinstance(request_id, str) else list(request_id)
    query = select(col(RequestNumber.id)).where(
        col(RequestNumber.request_hash).in_([request_hash(one) for one in ids]),
        col(RequestNumber.request_id).in_(ids),
    )
    return query if engines is None else query.where(col(RequestNumber.engine_id).in_(engines))


def numbers_of_pairs(pairs: Iterable[Pair]) -> Select:
    """The numbers of these (engine, request id) pairs."""
    return select(col(RequestNumber.id)).where(
        or_(
            *(
                and_(
                    col(RequestNumber.request_hash) == request_hash(request_id),
                    col(RequestNumber.request_id) == request_id,
                    col(RequestNumber.engine_id) == engine,
                )
                for engine, request_id in pairs
            )
        )
    )


_LOWEST_NUMBERS = tuple(
    text(f"SELECT MIN({COLUMN}) FROM {table} WHERE {COLUMN} > {NO_REQUEST}") for table in NUMBERED
)
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
