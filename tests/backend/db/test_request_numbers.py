"""Request numbers: one per (engine, request id), the same from every batch and writer; migration
12 numbers the rows an older database holds; a request's rows are read by their index of
numbers (SQLite, and PostgreSQL with KVSCOPE_TEST_POSTGRES_URL)."""

import pytest
from sqlalchemy import inspect, text
from sqlmodel import Session, select

from kvscope.backend.db import request_numbers
from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.database import is_sqlite
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate
from kvscope.backend.db.models import Failure, Lookup, Request, Span, TimelinePoint, Transfer
from kvscope.backend.queries.timeline import of_request
from tests.backend.db.conftest import T0, VLLM_ID

pytestmark = pytest.mark.timeout(60)


def _assign(engine, pairs) -> dict:
    with engine.begin() as connection:
        return request_numbers.assign(BulkCursor(connection), pairs)


def test_a_request_keeps_its_number_and_new_ones_follow_in_the_order_first_seen(engine):
    first = _assign(engine, [("e1", VLLM_ID), ("e1", "b"), ("", VLLM_ID)])
    again = _assign(engine, [("e1", VLLM_ID), ("e2", VLLM_ID)])
    assert again[("e1", VLLM_ID)] == first[("e1", VLLM_ID)]
    assert len({*first.values(), *again.values()}) == 4  # one per (engine, request id)
    assert again[("e2", VLLM_ID)] > max(first.values())


def _old_rows(connection) -> None:
    """Rows as version 11 stored them: request ids, no numbers."""
    writer = BulkCursor(connection)
    span_columns = (
        *("trace_id", "span_id", "name", "kind", "start_ns", "end_ns", "status_code"),
        *("attributes", "events", "links", "received_ns", "engine_id", "request_id"),
    )
    spans = [
        ("ab" * 16, f"{n:016x}", "kvscope.step", 0, T0 + n, T0 + n, 0, "{}", "[]", "[]", T0) + pair
        for n, pair in enumerate([("e1", VLLM_ID), (None, VLLM_ID), ("e2", "x")])
    ]
    writer.insert(Span.__table__, span_columns, spans)
    keys = ("trace_id", "span_id", "ordinal", "engine_id", "request_id")
    writer.insert(
        TimelinePoint.__table__,
        (*keys, "point", "time_ns"),
        [("ab" * 16, "01", 0, "e1", VLLM_ID, "lookup_start", T0)],
    )
    writer.insert(
        Transfer.__table__,
        (*keys[:2], *keys[3:], "start_ns", "end_ns", "ok"),
        [("ab" * 16, "02", "e1", VLLM_ID, T0, T0 + 1, True)],
    )
    writer.insert(
        Failure.__table__,
        (*keys, "time_ns", "kind"),
        [("ab" * 16, "03", 0, "e1", VLLM_ID, T0, "load_failed")],
    )
    writer.insert(
        Lookup.__table__,
        (*keys[:2], *keys[3:], "time_ns", "hit_tokens"),
        [("ab" * 16, "04", "e1", VLLM_ID, T0, 16)],
    )
    writer.insert(
        Request.__table__,
        (*keys[:2], *keys[3:], "start_ns", "status"),
        [("ab" * 16, "ff", "e1", VLLM_ID, T0, "running")],
    )


def test_migration_12_numbers_stored_rows_and_reads_find_them_by_number(engine):
    with engine.begin() as connection:  # as version 11 left it
        for table, indexes in request_numbers.NUMBERED.items():
            for index in indexes:
                connection.execute(text(f"CREATE INDEX {index} ON {table} (request_id)"))
        _old_rows(connection)
        connection.execute(text(f"UPDATE {VERSION_TABLE} SET version = 11"))
    assert migrate(engine) == latest_version()  # 12 and every later migration ran

    for table, indexes in request_numbers.NUMBERED.items():
        assert not set(indexes) & {i["name"] for i in inspect(engine).get_indexes(table)}
    request = Request(trace_id="ab" * 16, span_id="ff", request_id=VLLM_ID, engine_id="e1")
    with Session(engine) as session:
        spans = session.exec(select(Span).where(*of_request(Span, request))).all()
        # Its request id on its engine, or on none; not another engine's request.
        assert sorted(span.engine_id or "" for span in spans) == ["", "e1"]
        number = next(span.request_no for span in spans if span.engine_id == "e1")
        for model in (TimelinePoint, Transfer, Failure):
            (row,) = session.exec(select(model).where(*of_request(model, request))).all()
            assert row.request_no == number
        for model in (Lookup, Request):
            (row,) = session.exec(select(model).where(model.request_id == VLLM_ID)).all()
            assert row.request_no == number
    assert _assign(engine, [("e2", "x")]) == {("e2", "x"): _number(engine, "e2", "x")}


def _number(engine, engine_id: str, request_id: str) -> int:
    with engine.connect() as connection:
        return connection.execute(
            text("SELECT id FROM request_number WHERE engine_id = :e AND request_id = :r"),
            {"e": engine_id, "r": request_id},
        ).scalar_one()


def test_a_requests_rows_are_read_by_the_index_of_numbers(engine):
    if not is_sqlite(engine):
        pytest.skip("SQLite's plans only: PostgreSQL may scan tables this small")
    request = Request(trace_id="ab" * 16, span_id="ff", request_id=VLLM_ID, engine_id="e1")
    for model in (Span, TimelinePoint, Transfer, Failure):
        query = select(model).where(*of_request(model, request))
        compiled = query.compile(engine, compile_kwargs={"literal_binds": True})
        with engine.connect() as connection:
            plan = " | ".join(
                row[-1] for row in connection.execute(text(f"EXPLAIN QUERY PLAN {compiled}"))
            )
        table = model.__table__.name
        assert f"SCAN {table}" not in plan, plan
        assert "request_no" in plan, plan


def test_retention_drops_the_numbers_below_the_lowest_a_stored_row_carries(engine):
    # A batch's new numbers go in the pairs' sorted order.
    numbers = _assign(engine, [("e1", "a-old"), ("e1", "b-kept"), ("e1", "c-newer")])
    with engine.begin() as connection:
        request_numbers.number_dicts(rows := [_point_row("b-kept")], numbers)
        BulkCursor(connection).insert(
            TimelinePoint.__table__, list(rows[0]), [(*rows[0].values(),)]
        )
        assert request_numbers.prune(connection, batch=10) is False
    with engine.connect() as connection:
        left = connection.execute(text("SELECT request_id FROM request_number")).scalars().all()
    assert sorted(left) == ["b-kept", "c-newer"]  # a number above the lowest carried stays


def _point_row(request_id: str) -> dict:
    return {
        "trace_id": "cd" * 16,
        "span_id": "05",
        "ordinal": 0,
        "engine_id": "e1",
        "request_id": request_id,
        "point": "lookup_start",
        "time_ns": T0,
    }
