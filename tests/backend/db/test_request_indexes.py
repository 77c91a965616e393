"""The request table's index of request ids alone is gone (migration 12 drops it from an older
database): the (request id, engine) index serves a request id on its own (SQLite, and
PostgreSQL with KVSCOPE_TEST_POSTGRES_URL)."""

import pytest
from sqlalchemy import inspect, text

from kvscope.backend.db.engine import is_sqlite, make_engine
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate

pytestmark = pytest.mark.timeout(60)

DROPPED = "ix_kv_request_request_id"


def _indexes(engine) -> set[str]:
    return {index["name"] for index in inspect(engine).get_indexes("kv_request")}


def test_migration_12_drops_the_request_id_index_and_lookups_keep_an_index(database_url):
    engine = make_engine(database_url)
    migrate(engine)
    assert DROPPED not in _indexes(engine)  # a new database never has it
    with engine.begin() as connection:  # as version 11 left it
        connection.execute(text(f"CREATE INDEX {DROPPED} ON kv_request (request_id)"))
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version = 11"))
    assert migrate(engine) == latest_version()  # 12 and every later migration ran
    assert DROPPED not in _indexes(engine)
    assert "ix_request_request_engine" in _indexes(engine)

    with engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO kv_request (trace_id, span_id, request_id, engine_id, start_ns, "
                "status) VALUES ('ab', 'cd', 'cmpl-1-0-ab', 'e1', 1, 'finished')"
            )
        )
    lookup = "SELECT id FROM kv_request WHERE request_id = 'cmpl-1-0-ab'"
    with engine.connect() as connection:
        assert len(connection.execute(text(lookup)).all()) == 1
        if is_sqlite(engine):  # PostgreSQL may scan a table this small
            plan = " ".join(
                row[-1] for row in connection.execute(text(f"EXPLAIN QUERY PLAN {lookup}"))
            )
            assert "ix_request_request_engine" in plan, plan
    engine.dispose()
