"""Migration 8 on a database of version 7 (unique keys led by trace ids): its rows are kept, a
retry of batches stored before the upgrade is still recognised, and the backend then serves
what a backend given the same stream on a fresh database serves."""

import pytest
from sqlalchemy import Index, MetaData, UniqueConstraint, inspect
from sqlmodel import SQLModel

from kvscope.backend.db import rollups, time_keys
from kvscope.backend.db.bulk import add_postgres_stages
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate
from kvscope.backend.ingest.bound import Limits
from kvscope.backend.ingest.commit import Committer
from kvscope.backend.ingest.prepare import prepare
from kvscope.backend.ingest.write import STAGED_TABLES
from tests.backend.conftest import POSTGRES_URL, RunningBackend
from tests.backend.conftest import _throwaway_postgres_database as throwaway
from tests.backend.served_state import differences, recorded_bodies, served_state, settings_for

pytestmark = pytest.mark.timeout(300)

VERSION_7_KEYS = {
    # table: (unique key, its columns, time index, its column): what version 7 created
    "span": ("uq_span_trace_span", ("trace_id", "span_id"), "ix_span_start_ns", "start_ns"),
    "timelinepoint": (
        "uq_point_source",
        ("trace_id", "span_id", "point", "ordinal"),
        "ix_point_time",
        "time_ns",
    ),
    "transfer": ("uq_transfer_span", ("trace_id", "span_id"), "ix_transfer_start_ns", "start_ns"),
    "failure": (
        "uq_failure_source",
        ("trace_id", "span_id", "ordinal"),
        "ix_failure_time_ns",
        "time_ns",
    ),
    "lookup": ("uq_lookup_span", ("trace_id", "span_id"), "ix_lookup_time", "time_ns"),
    "latency": ("uq_latency_span", ("trace_id", "span_id"), "ix_latency_time", "time_ns"),
}


def _version_7(url: str) -> None:
    """An empty database as version 7 made it: the six tables with their trace-led keys."""
    engine = make_engine(url)
    migrate(engine)
    old = MetaData()
    for name, (key, columns, index, time_column) in VERSION_7_KEYS.items():
        table = SQLModel.metadata.tables[name].to_metadata(old)
        table.indexes = {i for i in table.indexes if not i.unique}
        table.append_constraint(UniqueConstraint(*columns, name=key))
        if index not in {declared.name for declared in table.indexes}:  # the span's stays
            Index(index, table.c[time_column])
    with engine.begin() as connection:
        for name in VERSION_7_KEYS:
            connection.exec_driver_sql(f"DROP TABLE {name}")
        old.create_all(connection)
        # Version 7 read points by request id (request numbers came with 13).
        connection.exec_driver_sql(
            "CREATE INDEX ix_point_request ON timelinepoint (request_id, engine_id)"
        )
        rollups.install(connection)
        if engine.dialect.name == "sqlite":
            # Version 7 also counted KV waits by a trigger reading the points by this index.
            connection.exec_driver_sql(
                "CREATE TRIGGER kvscope_rollup_kv_wait AFTER INSERT ON timelinepoint "
                "FOR EACH ROW BEGIN INSERT INTO series_rollup "
                "(metric, bucket_ns, engine_id, label, samples, positives, total, extra) "
                "SELECT 'kv_wait', 0, '', '0', COUNT(*), 0, 0, 0 "
                "FROM timelinepoint t INDEXED BY ix_point_request "
                "WHERE t.request_id = NEW.request_id HAVING 0 ON CONFLICT DO NOTHING; END"
            )
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version = 7")
    engine.dispose()


def _write_unmigrated(url: str, bodies: list[bytes]) -> int:
    """Batches stored by the ingest path straight into the version 7 tables (no migration);
    returns the spans stored."""
    engine = make_engine(url)
    add_postgres_stages(engine, STAGED_TABLES)  # as the app does
    committer = Committer(engine, 0)
    stored = sum(
        committer.commit(prepare(body, "application/json", Limits())).new_spans for body in bodies
    )
    engine.dispose()
    return stored


def _unique_keys(url: str) -> dict[str, list[tuple[str, ...]]]:
    engine = make_engine(url)
    found = inspect(engine)
    keys = {  # PostgreSQL lists a unique constraint's index among the indexes too
        name: sorted(
            {tuple(c["column_names"]) for c in found.get_unique_constraints(name)}
            | {tuple(i["column_names"]) for i in found.get_indexes(name) if i["unique"]}
        )
        for name in VERSION_7_KEYS
    }
    engine.dispose()
    return keys


@pytest.fixture
def fresh_url(database_url, tmp_path):
    """A second database of the module's kind (SQLite or PostgreSQL), fresh."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path}/fresh.db"
        return
    database = throwaway(POSTGRES_URL)
    yield next(database)
    next(database, None)  # drops it


def test_migration_8_keeps_rows_and_recognises_their_retries(database_url, fresh_url):
    old_url = database_url
    bodies = recorded_bodies()
    _version_7(old_url)
    assert _unique_keys(old_url)["span"] == [("trace_id", "span_id")]
    before = _write_unmigrated(old_url, bodies[: len(bodies) // 2])
    assert before > 0

    with (
        RunningBackend(settings_for(old_url)) as upgraded,  # migrates at start
        RunningBackend(settings_for(fresh_url)) as fresh,
    ):
        for backend in (upgraded, fresh):
            with backend.client() as client:
                for body in bodies:  # the first half again: an exporter's retries
                    answer = client.post(
                        "/v1/traces", content=body, headers={"Content-Type": "application/json"}
                    )
                    assert answer.status_code == 200, answer.text
        stored = {}
        for name, backend in (("upgraded", upgraded), ("fresh", fresh)):
            with backend.client() as client:
                health = client.get("/health").json()
            assert health["schema_version"] == latest_version()
            stored[name] = health["spans_stored_since_start"]  # spans new to its database
        assert stored["upgraded"] + before == stored["fresh"]  # the retries stored nothing
        want = served_state(fresh)
        assert want["timelines"] and want["incidents"]
        assert differences(served_state(upgraded), want) == []

    keys = _unique_keys(old_url)
    assert keys == _unique_keys(fresh_url)
    for name in VERSION_7_KEYS:
        assert keys[name][0][0] in ("start_ns", "time_ns"), keys  # led by time
    assert set(time_keys.REKEYED) == set(VERSION_7_KEYS)
