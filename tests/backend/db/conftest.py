"""What the request-number tests share: a request id as vLLM makes it, and a migrated database
whose request tables start empty (modules with an `engine` fixture of their own use that)."""

import pytest
from sqlalchemy import text

from kvscope.backend.db import request_numbers
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import migrate

T0 = 1_800_000_000 * 10**9
VLLM_ID = "cmpl-9f0c2a61d4b84e27a1c3b5d7e9f01234-0-a1b2c3d4"
"""A request id as a served vLLM hands it to a connector."""


@pytest.fixture
def engine(database_url):
    engine = make_engine(database_url)
    migrate(engine)
    with engine.begin() as connection:  # a module's tests share one database
        for table in (*request_numbers.NUMBERED, "request_number", "series_rollup"):
            connection.execute(text(f"DELETE FROM {table}"))
    yield engine
    engine.dispose()
