"""Advisory locks that make two backends' writes of one request take turns (PostgreSQL)."""

import hashlib
from collections.abc import Iterable

from kvscope.backend.db.bulk import BulkCursor

MAX_REQUEST_LOCKS = 256
"""Requests a transaction locks one by one; a batch of more locks every request with one lock.
PostgreSQL keeps advisory locks in its shared lock table, max_locks_per_transaction x
max_connections entries (6400 by default) for all sessions together: a lock per request of a
huge batch could fill it, and then every transaction fails with 'out of shared memory'."""

EVERY_REQUEST = 0x6B767372657173  # 'kvsreqs', beside migrations' MIGRATION_LOCK
"""Held shared by a transaction that locks its requests one by one, exclusive by one that
locks them all at once."""

# Two backends on one PostgreSQL: the rollup triggers (db/rollups.py) and the writer's KV wait
# reads (db/kv_waits.py) read the other rows of a row's request, and rows of a transaction not
# yet committed are unseen, so two batches of one request could each count a lookup as the
# request's last, or a KV wait twice; and two could each number the same new request
# (db/request_numbers.py: its table has no unique key on the id). A transaction locks its
# requests before its first insert, until commit, all in one statement in one order (unnest
# reads the array in order: the shared lock first, then keys ascending), so no two can wait
# for each other; under READ COMMITTED each later statement sees the rows of the one it
# waited for.
# SQLite needs none: its one writer at a time takes the write lock at the batch's first insert.
_LOCK_EACH = (
    "SELECT CASE WHEN n = 1 THEN pg_advisory_xact_lock_shared(key) "
    "ELSE pg_advisory_xact_lock(key) END "
    "FROM unnest(CAST(? AS bigint[])) WITH ORDINALITY AS locks(key, n)"
)
_LOCK_ALL = "SELECT pg_advisory_xact_lock(?)"


def lock(writer: BulkCursor, requests: Iterable[tuple[str | None, str | None]]) -> None:
    """Locks each (engine_id, request_id) until commit; PostgreSQL only (`requests` is not
    read on SQLite). A None request_id locks nothing."""
    if not writer.postgres:
        return
    keys = sorted(
        {
            request_key(engine_id, request_id)
            for engine_id, request_id in requests
            if request_id is not None
        }
    )
    if len(keys) > MAX_REQUEST_LOCKS:
        writer.execute(_LOCK_ALL, (EVERY_REQUEST,))
    elif keys:
        writer.execute(_LOCK_EACH, ([EVERY_REQUEST, *keys],))


def request_key(engine_id: str | None, request_id: str) -> int:
    """A request's lock key, the same in every backend process (Python's hash() is salted);
    two requests sharing one only take turns."""
    name = f"{engine_id or ''}\0{request_id}".encode()
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "big", signed=True)
