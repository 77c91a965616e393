"""KV waits counted by the writer around a batch's timeline points: once per request, moved when
an earlier point arrives, untouched by a retry; migration 10 drops the trigger that counted them
(SQLite, and PostgreSQL with KVSCOPE_TEST_POSTGRES_URL)."""

import pytest
from sqlalchemy import text

from kvscope.backend.db import kv_waits, request_numbers, rollups
from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate
from kvscope.backend.db.models import TimelinePoint
from kvscope.backend.ingest.request_rows import POINT_COLUMNS

pytestmark = pytest.mark.timeout(60)

S = 1_000_000_000
T0 = 1_800_000_000 * S
ENGINE_AT, REQUEST_AT = POINT_COLUMNS.index("engine_id"), POINT_COLUMNS.index("request_id")


def _point(span: int, point: str, at: int, request_id: str = "r1", engine_id="e1") -> tuple:
    row = {
        "trace_id": "ab" * 16,
        "span_id": f"{span:016x}",
        "ordinal": 0,
        "engine_id": engine_id,
        "request_id": request_id,
        "point": point,
        "time_ns": at,
        "value": None,
        "layer": None,
    }
    return tuple(row[column] for column in POINT_COLUMNS)


def _write(engine, rows: list[tuple]) -> int:
    with engine.begin() as connection:
        writer = BulkCursor(connection)  # numbered by request, as the ingest writer does
        pairs = [(row[ENGINE_AT] or "", row[REQUEST_AT]) for row in rows if row[REQUEST_AT]]
        numbers = request_numbers.assign(writer, pairs)
        numbered = request_numbers.numbered(rows, ENGINE_AT, REQUEST_AT, numbers)
        columns = (*POINT_COLUMNS, request_numbers.COLUMN)
        return kv_waits.insert_points(writer, TimelinePoint.__table__, columns, numbered)


def _waits(engine) -> dict[tuple, int]:
    """(second, engine, bin's [low, high) ms) -> samples, counters at zero left out."""
    with engine.connect() as connection:
        found = connection.execute(
            text(
                "SELECT bucket_ns, engine_id, label, samples FROM series_rollup "
                "WHERE metric = 'kv_wait' AND samples != 0"
            )
        ).all()
    return {(b, e, rollups.bin_bounds_ms(label)): n for b, e, label, n in found}


@pytest.fixture
def engine(database_url):
    engine = make_engine(database_url)
    migrate(engine)
    with engine.begin() as connection:  # the module's tests share one database
        connection.execute(text("DELETE FROM timelinepoint"))
        connection.execute(text("DELETE FROM series_rollup"))
    yield engine
    engine.dispose()


def test_a_wait_is_counted_once_when_both_ends_are_in_and_moves_with_an_earlier_end(engine):
    allocated = T0 + S // 2
    # Points of other kinds and other requests' allocations alone count nothing.
    assert _write(engine, [_point(1, "blocks_allocated", allocated), _point(2, "lookup_start", T0)])
    assert _waits(engine) == {}
    load = [_point(3, "transfer_complete", allocated + 250_000_000)]  # 250 ms later
    assert _write(engine, load) == 1
    assert _waits(engine) == {(T0, "e1", (250.0, 260.0)): 1}
    assert _write(engine, load) == 0  # an exporter's retry
    assert _waits(engine) == {(T0, "e1", (250.0, 260.0)): 1}
    # An earlier end (a resume 40 ms after the allocation) replaces the wait...
    assert _write(engine, [_point(4, "resumed", allocated + 40_000_000)]) == 1
    assert _waits(engine) == {(T0, "e1", (40.0, 41.0)): 1}
    # ...and an earlier start moves it to its own second, a later one to nothing.
    earlier = [_point(5, "blocks_allocated", T0 - S + 1), _point(6, "blocks_allocated", T0 + S)]
    assert _write(engine, earlier) == 2
    assert _waits(engine) == {(T0 - S, "e1", (1500.0, 1600.0)): 1}


def test_a_batch_of_many_requests_counts_each_of_its_own(engine):
    rows = []
    for n in range(40):
        start = T0 + n * S
        for span, engine_id in ((4 * n, "e1"), (4 * n + 2, None)):  # one id on two engines
            rows.append(_point(span, "blocks_allocated", start, f"r{n}", engine_id))
            rows.append(_point(span + 1, "resumed", start + n * 1_000_000, f"r{n}", engine_id))
    rows.append(_point(999, "resumed", T0, None))  # no request: no wait
    assert _write(engine, rows) == len(rows)
    waits = _waits(engine)
    assert sum(waits.values()) == 80
    assert waits[(T0 + 7 * S, "", (7.0, 7.1))] == waits[(T0 + 7 * S, "e1", (7.0, 7.1))] == 1
    assert waits[(T0, "e1", (0.0, 0.001))] == 1  # a load at its allocation: no wait


def _has_trigger(engine) -> bool:
    with engine.connect() as connection:
        if engine.dialect.name == "postgresql":
            sql = "SELECT COUNT(*) FROM pg_trigger WHERE tgname = 'kvscope_rollup_kv_wait'"
        else:
            sql = "SELECT COUNT(*) FROM sqlite_master WHERE name = 'kvscope_rollup_kv_wait'"
        return connection.execute(text(sql)).scalar_one() > 0


def test_migration_10_drops_the_trigger_so_a_wait_is_counted_once(engine):
    postgres = engine.dialect.name == "postgresql"
    # Version 9 counted waits by a row trigger: one of that name, adding a wait per allocation.
    count = rollups.add_sql("SELECT 'kv_wait', 0, 'trigger', '0', 1, 0, 0, 0 WHERE true")
    with engine.begin() as connection:
        cursor = connection.connection.cursor()
        if postgres:
            cursor.execute(
                "CREATE FUNCTION kvscope_rollup_kv_wait() RETURNS trigger LANGUAGE plpgsql AS "
                f"$body$ BEGIN {count}; RETURN NULL; END $body$"
            )
            cursor.execute(
                "CREATE TRIGGER kvscope_rollup_kv_wait AFTER INSERT ON timelinepoint "
                "FOR EACH ROW EXECUTE FUNCTION kvscope_rollup_kv_wait()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER kvscope_rollup_kv_wait AFTER INSERT ON timelinepoint "
                f"FOR EACH ROW BEGIN {count}; END"
            )
        cursor.execute(f"UPDATE {VERSION_TABLE} SET version = 9")
    assert _has_trigger(engine)
    assert migrate(engine) == latest_version()  # 10 and every later migration ran
    assert not _has_trigger(engine)
    _write(engine, [_point(1, "blocks_allocated", T0), _point(2, "resumed", T0 + 5_000_000)])
    assert _waits(engine) == {(T0, "e1", (5.0, 5.1)): 1}
