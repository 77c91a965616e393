"""Database engine for SQLite (a WAL-mode file) or PostgreSQL, and the session dependency."""

import sqlite3

from sqlalchemy import Engine, create_engine, event

SQLITE_PRAGMAS = (
    # Set before the file exists (later it is a no-op). Half the default: a random insert
    # into an index rewrites a whole page in the WAL, and span ids and trace ids are random.
    "PRAGMA page_size=2048",
    "PRAGMA journal_mode=WAL",
    # WAL with synchronous=NORMAL stays consistent after a crash; it may lose the last commit.
    "PRAGMA synchronous=NORMAL",
    "PRAGMA busy_timeout=30000",
    "PRAGMA cache_size=-65536",
    "PRAGMA temp_store=MEMORY",
    # Commits never copy the WAL into the database file: backend.checkpoint does, aside.
    "PRAGMA wal_autocheckpoint=0",
)


def normalized_url(url: str) -> str:
    """PostgreSQL URLs go through psycopg 3, the driver kvscope installs."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str) -> Engine:
    url = normalized_url(url)
    if not url.startswith("sqlite"):
        # Whatever the server's default: writers' locks (seqs, request_locks) rely on each
        # statement seeing what the transaction they waited for committed.
        return create_engine(
            url,
            pool_pre_ping=True,
            pool_size=8,
            max_overflow=8,
            isolation_level="READ COMMITTED",
        )
    if url in ("sqlite://", "sqlite:///:memory:"):
        raise ValueError("use a SQLite file (sqlite:///path.db): the backend's threads share it")
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
    event.listen(engine, "connect", _sqlite_pragmas)
    sqlite3.register_adapter(type(None), _null)
    return engine


def _null(_none: None) -> None:
    """None's adapter for the sqlite3 driver, which binds it as NULL either way.

    The driver binds ints, floats and texts directly, but looks for an adapter for any other
    type, None included: a registry miss and two attribute lookups, one of which raises and
    swallows an AttributeError. That cost 270 ns a value against 40 for an int, and an ingest
    batch binds about five NULLs a span (parents of root spans, values a row does not have);
    found by this adapter, a None costs about 90 ns more than an int. The registry is the
    driver's, for the whole process: this adapter changes no value, only the way there.
    """
    return None


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in SQLITE_PRAGMAS:
        cursor.execute(pragma)
    cursor.close()
