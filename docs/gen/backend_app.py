"""The backend's app over an empty SQLite database, built as `kvscope backend` builds it."""

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def backend_app() -> Iterator:
    from kvscope.backend.main import create_app
    from kvscope.backend.settings import Settings

    with tempfile.TemporaryDirectory() as folder:
        database = Path(folder) / "kvscope.db"
        app = create_app(Settings(database_url=f"sqlite:///{database}", ingest_workers=0))
        try:
            yield app
        finally:
            app.state.ingest.close()
            app.state.engine.dispose()
