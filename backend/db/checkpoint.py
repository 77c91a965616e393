"""SQLite WAL checkpoints in a thread of their own, so that no batch waits for the disk.

By default the connection that commits copies the WAL into the database file once the WAL
passes 1,000 pages, and syncs that file: on a cloud disk that put 20-60 ms into every few
batches. Here commits only append to the WAL; this thread copies it over without blocking
them (PASSIVE), and once the WAL has grown past `wal_limit_bytes` (a busy writer never
leaves a moment in which SQLite could restart it) it truncates it, holding the writer lock
for that short while.
"""

import logging
import threading

from sqlalchemy import Engine

from kvscope.backend.db.database import is_sqlite

logger = logging.getLogger(__name__)

INTERVAL_S = 0.25
"""Pause between checkpoints."""

WAL_LIMIT_BYTES = 64 * 1024 * 1024
"""WAL size past which the checkpointer restarts the WAL from its start."""


class Checkpointer:
    """The background checkpointer of one SQLite database (nothing for PostgreSQL)."""

    def __init__(
        self,
        engine: Engine,
        writer_lock: threading.Lock,
        interval_s: float = INTERVAL_S,
        wal_limit_bytes: int = WAL_LIMIT_BYTES,
    ) -> None:
        self.engine = engine
        self.writer_lock = writer_lock
        self.interval_s = interval_s
        self.wal_limit_bytes = wal_limit_bytes
        self.checkpoints = 0
        self.truncations = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._page_size: int | None = None

    def start(self) -> None:
        if not is_sqlite(self.engine) or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the thread and folds the whole WAL into the database file."""
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=30)
        self._thread = None
        try:
            with self.writer_lock:
                self._checkpoint("TRUNCATE")
        except Exception:
            logger.exception("final WAL checkpoint failed; SQLite replays the WAL on next open")

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_once()
            except Exception:  # the next pass tries again; commits go on meanwhile
                logger.exception("WAL checkpoint failed")

    def run_once(self) -> None:
        _, wal_pages, _ = self._checkpoint("PASSIVE")  # -1 when not in WAL mode
        if wal_pages > 0 and wal_pages * self._page_bytes() > self.wal_limit_bytes:
            with self.writer_lock:
                self._checkpoint("TRUNCATE")
            self.truncations += 1

    def _checkpoint(self, mode: str) -> tuple[int, int, int]:
        with self.engine.connect() as connection:
            busy, wal_pages, copied = connection.exec_driver_sql(
                f"PRAGMA wal_checkpoint({mode})"
            ).one()
        self.checkpoints += 1
        return busy, wal_pages, copied

    def _page_bytes(self) -> int:
        """The database's page size, fixed once the file exists: read once."""
        if self._page_size is None:
            with self.engine.connect() as connection:
                page_size: int = connection.exec_driver_sql("PRAGMA page_size").scalar_one()
            self._page_size = page_size
        return self._page_size
