"""The overview's series, read from the per-second rollups the triggers and the writer keep,
say what the raw rows say: rows in shuffled batches, request rows before and after their
lookups, repeated lookups, exporter retries (SQLite, and PostgreSQL with
KVSCOPE_TEST_POSTGRES_URL)."""

import random

import pytest
from sqlalchemy import text
from sqlmodel import Session

from kvscope.backend.db import kv_waits, request_numbers, rollups
from kvscope.backend.db.bulk import DO_NOTHING, BulkCursor
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate
from kvscope.backend.db.models import Latency, Lookup, Request, TimelinePoint, Transfer
from kvscope.backend.ingest.write import _REQUEST_UPSERT
from kvscope.backend.queries import aggregates, series

pytestmark = pytest.mark.timeout(120)

S = 1_000_000_000
T0 = 1_800_000_000 * S  # a whole second
STEP = 5 * S
REQUESTS = 300


def _rows(rng: random.Random) -> dict[str, list[dict]]:
    """Rows of REQUESTS requests on two engines over a minute, as the ingest derives them."""
    found: dict[str, list[dict]] = {k: [] for k in ("lookup", "request", "point", "xfer", "lat")}
    for n in range(REQUESTS):
        engine, request_id = f"e{n % 2}", f"r{n}"
        start = T0 + rng.randrange(60 * S)
        ids = {"trace_id": f"{n:032x}", "request_id": request_id}
        for attempt in range(rng.choice([1, 1, 2, 3])):  # repeated while it waits to schedule
            at = start + attempt * rng.randrange(1, 3 * S)
            found["lookup"].append(
                {
                    **ids,
                    "span_id": f"{n:08x}{attempt:08x}",
                    "engine_id": engine,
                    "connector": "MultiConnector",
                    "child": None,
                    "time_ns": at,
                    "hit_tokens": rng.choice([0, 0, 16, 64, 256]),
                }
            )
            found["lookup"].append(  # a child's lookup: not in the composite's hit rate
                {
                    **ids,
                    "span_id": f"c{n:07x}{attempt:08x}",
                    "engine_id": engine,
                    "connector": "MultiConnector",
                    "child": "p2p",
                    "time_ns": at,
                    "hit_tokens": 8,
                }
            )
        found["request"].append(
            {
                **ids,
                "span_id": f"{n:016x}",
                "engine_id": engine,
                "start_ns": start,
                "end_ns": start + 5 * S,
                "status": "finished",
                "prompt_tokens": rng.choice([None, 512, 1000]),
            }
        )
        allocated = start + rng.randrange(S // 2)
        for point, at in [("blocks_allocated", allocated), ("resumed", allocated + 3 * S)] + (
            [("transfer_complete", allocated + rng.randrange(1, 10**9))] if n % 3 else []
        ):
            found["point"].append(
                {
                    **ids,
                    "span_id": f"{n:08x}{len(found['point']):08x}",
                    "engine_id": engine,
                    "point": point,
                    "ordinal": 0,
                    "time_ns": at,
                }
            )
        found["xfer"].append(
            {
                **ids,
                "span_id": f"{n:016x}",
                "engine_id": engine,
                "direction": rng.choice(["load", "store", None]),
                "bytes": rng.randrange(10**7),
                "ok": True,
                "start_ns": allocated,
                "end_ns": allocated + S,
            }
        )
        found["lat"].append(
            {**ids, "span_id": f"{n:016x}", "time_ns": start, "ttft_ms": rng.uniform(0.5, 900)}
        )
    return found


TABLES = {
    "lookup": (Lookup.__table__, DO_NOTHING),
    "point": (TimelinePoint.__table__, DO_NOTHING),
    "xfer": (Transfer.__table__, DO_NOTHING),
    "lat": (Latency.__table__, DO_NOTHING),
}


def _write(engine, rows: dict[str, list[dict]], rng: random.Random, by_table: bool) -> None:
    """Every row in shuffled batches, a third of them sent twice (an exporter's retry); each
    request row once as a 'running' stub (no prompt yet) and once final. Row by row in batches
    of 40, or as the ingest writes: a batch's rows of one table in one insert, in batches of 400
    (multi-row statements whose rows' triggers read rows of the same statement)."""
    items = [(kind, row) for kind, kinds in rows.items() for row in kinds]
    items += [
        ("stub", {**row, "end_ns": None, "status": "running", "prompt_tokens": None})
        for row in rows["request"]
    ]
    items += rng.sample(items, len(items) // 3)
    rng.shuffle(items)
    size = 400 if by_table else 40
    for first in range(0, len(items), size):
        groups: dict[str, list[dict]] = {}
        for kind, row in items[first : first + size]:
            groups.setdefault(kind, []).append(row)
        with engine.begin() as connection:
            writer = BulkCursor(connection)
            if by_table:
                for kind, kind_rows in groups.items():
                    _insert(writer, kind, kind_rows)
            else:
                for kind, row in items[first : first + size]:
                    _insert(writer, kind, [row])


def _insert(writer: BulkCursor, kind: str, rows: list[dict]) -> None:
    if kind in ("request", "stub"):
        updates = ", ".join(f"{c} = excluded.{c}" for c in ("end_ns", "status", "prompt_tokens"))
        on_conflict = DO_NOTHING if kind == "stub" else _REQUEST_UPSERT.format(updates=updates)
        table = Request.__table__
    else:
        table, on_conflict = TABLES[kind]
    if table.name in request_numbers.NUMBERED:  # numbered, as the ingest's writer numbers them
        rows = [dict(row) for row in rows]
        pairs = [(r["engine_id"] or "", r["request_id"]) for r in rows if r["request_id"]]
        request_numbers.number_dicts(rows, request_numbers.assign(writer, pairs))
    columns, values = list(rows[0]), [tuple(row.values()) for row in rows]
    if kind == "point":  # as the ingest's writer: the KV waits counted around the insert
        kv_waits.insert_points(writer, table, columns, values)
    else:
        writer.insert(table, columns, values, on_conflict)


def _raw_hits(connection) -> dict[int, tuple]:
    """Per step: each request's last composite lookup per connector, its prompt."""
    last: dict[tuple, tuple] = {}
    for engine_id, request_id, connector, at, row_id, hit in connection.execute(
        text(
            "SELECT engine_id, request_id, connector, time_ns, id, hit_tokens FROM lookup "
            "WHERE child IS NULL"
        )
    ):
        key = (engine_id, request_id, connector)
        if key not in last or (at, row_id) > last[key][:2]:
            last[key] = (at, row_id, hit)
    prompts = dict(
        ((e, r), p)
        for e, r, p in connection.execute(
            text(
                "SELECT engine_id, request_id, MAX(prompt_tokens) FROM kv_request "
                "GROUP BY engine_id, request_id"
            )
        )
    )
    steps: dict[int, list[int]] = {}
    for (engine_id, request_id, _), (at, _, hit) in last.items():
        step = steps.setdefault((at - T0) // STEP, [0, 0, 0, 0])
        prompt = prompts.get((engine_id, request_id)) or 0
        for i, value in enumerate((1, int(hit > 0), hit, prompt)):
            step[i] += value
    return {T0 + k * STEP: tuple(v) for k, v in steps.items()}


def _raw_waits(connection) -> dict[int, list[float]]:
    firsts: dict[tuple, list] = {}
    for engine_id, request_id, point, at in connection.execute(
        text("SELECT engine_id, request_id, point, time_ns FROM timelinepoint")
    ):
        first = firsts.setdefault((engine_id, request_id), [None, None])
        slot = 0 if point == "blocks_allocated" else 1
        first[slot] = at if first[slot] is None else min(first[slot], at)
    waits: dict[int, list[float]] = {}
    for allocated, loaded in firsts.values():
        at = T0 + (allocated - T0) // STEP * STEP
        waits.setdefault(at, []).append(max(0, loaded - allocated) / 1e6)
    return waits


@pytest.fixture(scope="module", params=["row_by_row", "by_table"])
def stored(database_url, request):
    engine = make_engine(database_url)
    migrate(engine)
    with engine.begin() as connection:  # the other way of writing used this database first
        for table in ("lookup", "kv_request", "timelinepoint", "transfer", "latency"):
            connection.execute(text(f"DELETE FROM {table}"))
        connection.execute(text("DELETE FROM series_rollup"))
    rng = random.Random(20)
    _write(engine, _rows(rng), rng, by_table=request.param == "by_table")
    bounds = aggregates.window(T0, T0 + 120 * S, STEP)
    with Session(engine) as session:
        built = series.build(session, bounds, [])
        yield built, session.connection()
    engine.dispose()


def test_hit_series_equal_the_raw_lookups(stored):
    built, connection = stored
    found = {
        p.time_ns: (p.lookups, p.hit_requests, p.hit_tokens, p.prompt_tokens) for p in built.hits
    }
    assert found == _raw_hits(connection)
    assert sum(p.lookups for p in built.hits) == REQUESTS


def test_the_summary_hit_tokens_equal_the_raw_lookups(stored):
    _, connection = stored
    found = connection.execute(aggregates.ROLLED_HIT_TOKENS, aggregates.window(T0, T0 + 120 * S))
    assert found.scalar_one() == sum(hits for _, _, hits, _ in _raw_hits(connection).values())


def test_bytes_per_direction_equal_the_raw_transfers(stored):
    built, connection = stored
    raw: dict[tuple, int] = {}
    for start, direction, size in connection.execute(
        text("SELECT start_ns, direction, bytes FROM transfer")
    ):
        key = (T0 + (start - T0) // STEP * STEP, direction or "unknown")
        raw[key] = raw.get(key, 0) + size
    assert {(p.time_ns, p.direction): p.bytes for p in built.bytes} == raw


def _close(found: float | None, exact: float | None) -> bool:
    return found is not None and exact is not None and abs(found - exact) <= 0.1 * exact + 1e-3


def test_ttft_and_kv_wait_percentiles_follow_the_raw_values(stored):
    built, connection = stored
    ttft: dict[int, list[float]] = {}
    for at, ms in connection.execute(text("SELECT time_ns, ttft_ms FROM latency")):
        ttft.setdefault(T0 + (at - T0) // STEP * STEP, []).append(ms)
    waits = _raw_waits(connection)
    assert {p.time_ns: p.requests for p in built.ttft if p.requests} == {
        at: len(v) for at, v in ttft.items()
    }
    assert {p.time_ns: p.kv_waits for p in built.ttft if p.kv_waits} == {
        at: len(v) for at, v in waits.items()
    }
    for point in built.ttft:
        for samples, p50, p95 in (
            (ttft.get(point.time_ns), point.ttft_p50_ms, point.ttft_p95_ms),
            (waits.get(point.time_ns), point.kv_wait_p50_ms, point.kv_wait_p95_ms),
        ):
            if samples:
                exact50, exact95 = aggregates.percentiles(sorted(samples))
                assert _close(p50, exact50) and _close(p95, exact95), (samples, p50, p95)


def test_a_step_of_the_route_is_whole_seconds():
    assert series.step_for(900, None) == 15.0
    assert series.step_for(100, None) == 2.0  # 1.67 s widened to the rollups' second
    assert series.step_for(60, 0.2) == 1.0


def test_migration_6_brings_the_rollups_to_an_older_database(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/old.db")
    migrate(engine)
    with engine.begin() as connection:  # back to version 5: no rollup table, no triggers
        for name, *_ in rollups.TRIGGERS:
            connection.exec_driver_sql(f"DROP TRIGGER {name}")
        connection.exec_driver_sql("DROP TABLE series_rollup")
        connection.exec_driver_sql("DROP INDEX ix_lookup_request_no")
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version = 5")
    assert migrate(engine) == latest_version()  # 6 and every later migration ran
    rows = _rows(random.Random(6))
    _write(
        engine,
        {"lookup": rows["lookup"][:1], **{k: [] for k in rows if k != "lookup"}},
        random.Random(6),
        by_table=False,
    )
    with engine.connect() as connection:
        found = connection.execute(text("SELECT metric, samples FROM series_rollup")).all()
    engine.dispose()
    assert [tuple(row) for row in found] == [("hit", 1)]
