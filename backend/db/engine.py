"""Database engine for SQLite (a WAL-mode file) or PostgreSQL, and the session dependency."""

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
    return engine


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    for pragma in SQLITE_PRAGMAS:
        cursor.execute(pragma)
    cursor.close()
