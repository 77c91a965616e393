"""A batch PostgreSQL rolls back as a deadlock's victim is written again, not refused (503)."""

import logging
import threading
import time

import pytest
from sqlalchemy import Engine, text

from kvscope.backend.db import request_locks
from kvscope.backend.db.bulk import add_postgres_stages
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import migrate
from kvscope.backend.ingest.commit import Committer, Stored
from kvscope.backend.ingest.prepare import Prepared
from kvscope.backend.ingest.write import STAGED_TABLES
from tests.backend.conftest import POSTGRES_URL, SKIP_POSTGRES, _throwaway_postgres_database
from tests.backend.db.test_concurrent_writers import WAIT_S, Story, _commit, _lookup, _rollups

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine():
    """PostgreSQL only: SQLite has one writer at a time, so no deadlock between writers."""
    if not POSTGRES_URL:
        pytest.skip(SKIP_POSTGRES)
    for url in _throwaway_postgres_database(POSTGRES_URL):
        engine = make_engine(url)
        add_postgres_stages(engine, STAGED_TABLES)
        migrate(engine)
        yield engine
        engine.dispose()


def _waiting_advisory_pids(engine: Engine, other_than: int) -> list[int]:
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND pid != :other"
            ),
            {"other": other_than},
        )
        return [row[0] for row in rows]


class Commit(threading.Thread):
    """Committer.commit of one batch in a thread, as a server's ingest worker calls it."""

    def __init__(self, committer: Committer, prepared: Prepared) -> None:
        super().__init__(daemon=True)
        self.committer, self.prepared = committer, prepared
        self.stored: Stored | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.stored = self.committer.commit(self.prepared)
        except BaseException as error:
            self.error = error


def test_a_deadlock_victim_is_written_again_and_counted_once(engine, caplog):
    """Another backend's transaction holds the batch's request lock, then asks for the lock
    every batch shares: each waits for the other. PostgreSQL aborts the batch (the older wait
    is checked first); the committer writes it again once the other has let go."""
    serial, racing = Story("deadlock: serial"), Story("deadlock: victim")
    _commit(engine, serial.batch(_lookup(1, 192)))
    facts = racing.batch(_lookup(1, 192))
    key = request_locks.request_key(racing.engine_id, "req-0")

    caplog.set_level(logging.INFO, logger="kvscope.backend.ingest.commit")
    with engine.connect() as other:
        other_pid = other.connection.dbapi_connection.info.backend_pid
        other.execute(text("SET statement_timeout = '30s'"))
        other.execute(text("SET deadlock_timeout = '60s'"))  # the batch's wait finds the cycle
        other.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
        commit = Commit(Committer(engine, 10), Prepared(facts, {}, 0, None, time.time_ns()))
        commit.start()
        deadline = time.monotonic() + WAIT_S
        while not _waiting_advisory_pids(engine, other_pid):
            assert time.monotonic() < deadline, "the batch never waited for its request's lock"
            time.sleep(0.005)
        # Returns once PostgreSQL has aborted the batch's transaction (its shared lock goes).
        other.execute(
            text("SELECT pg_advisory_xact_lock(:every)"),
            {"every": request_locks.EVERY_REQUEST},
        )
        other.rollback()
    commit.join(WAIT_S)

    assert not commit.is_alive() and commit.error is None, commit.error
    assert commit.stored is not None and commit.stored.spans == len(facts.spans)
    assert "rolled back by a deadlock: writing them again" in caplog.text
    assert _rollups(engine, racing.engine_id) == _rollups(engine, serial.engine_id)
