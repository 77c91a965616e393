"""Migration 13 on a database of version 12 (numbers found by an index of request ids, request
rows keyed by trace and span): numbers and rows are kept, numbers are found by their hash, a
request row is keyed by its number; and the keys hold for rows of no request id and for ids
whose hashes collide (SQLite, and PostgreSQL with KVSCOPE_TEST_POSTGRES_URL)."""

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    inspect,
    text,
)
from sqlmodel import Session, SQLModel, select

from kvscope.backend.db import request_numbers, rollups
from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.migrations import VERSION_TABLE, latest_version, migrate
from kvscope.backend.db.models import Request
from kvscope.backend.ingest.facts import Facts
from kvscope.backend.ingest.write import write_rows
from tests.backend.db.conftest import T0, VLLM_ID

pytestmark = pytest.mark.timeout(60)


def _version_12(engine) -> None:
    """The request and number tables as version 12 made them, with rows it wrote: a request's
    'running' stub and a request row of no request id."""
    old = MetaData()
    requests = SQLModel.metadata.tables["kv_request"].to_metadata(old)
    requests.indexes = {index for index in requests.indexes if not index.unique}
    requests.append_constraint(UniqueConstraint("trace_id", "span_id", name="uq_request_span"))
    Index("ix_request_request_no", requests.c.request_no)
    Table(
        "request_number",
        old,
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        Column("request_id", String, nullable=False),
        Column("engine_id", String, nullable=False),
        UniqueConstraint("request_id", "engine_id", name="uq_request_number"),
    )
    with engine.begin() as connection:
        if connection.dialect.name == "sqlite":  # triggers of other tables read these
            for name, *_ in rollups.TRIGGERS:
                connection.exec_driver_sql(f"DROP TRIGGER IF EXISTS {name}")
        connection.exec_driver_sql("DROP TABLE kv_request")
        connection.exec_driver_sql("DROP TABLE request_number")
        old.create_all(connection)
        connection.exec_driver_sql(
            "INSERT INTO request_number (request_id, engine_id) "
            f"VALUES ('other', 'e1'), ('{VLLM_ID}', 'e1')"  # numbers 1 and 2
        )
        rows = [
            _row("ff", VLLM_ID, "running") | {"request_no": 2},
            _row("ee", None, "finished") | {"request_no": None},
        ]
        BulkCursor(connection).insert(
            Request.__table__, list(rows[0]), [(*r.values(),) for r in rows]
        )
        rollups.install(connection)
        connection.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version = 12")


def _row(span_id: str, request_id: str | None, status: str) -> dict:
    """A request row as the ingest path builds it (backend/ingest/request_rows.py)."""
    return {
        "trace_id": "ab" * 16,
        "span_id": span_id,
        "request_id": request_id,
        "engine_id": "e1",
        "connector": "offload",
        "kv_role": None,
        "instance_id": "i1",
        "start_ns": T0,
        "end_ns": None if status == "running" else T0 + 1,
        "status": status,
        "status_message": None,
        "prompt_tokens": 16,
    }


def _write(engine, requests: list[dict]) -> None:
    with engine.begin() as connection:
        write_rows(connection, Facts(requests=requests), {}, T0)


def _requests(engine) -> list[tuple]:
    with Session(engine) as session:
        query = select(Request.request_no, Request.span_id, Request.status)
        return sorted(session.exec(query).all())


def test_migration_13_keeps_numbers_and_rows_and_keys_request_rows_by_number(engine):
    _version_12(engine)
    assert migrate(engine) == latest_version()

    with engine.connect() as connection:
        stored = connection.execute(
            text("SELECT id, request_id, request_hash FROM request_number ORDER BY id")
        ).all()
    assert [(number, request_id) for number, request_id, _ in stored] == [
        (1, "other"),
        (2, VLLM_ID),
    ]
    # SQL's hash (the migration's) is Python's (the writer's and the readers').
    assert [hashed for *_, hashed in stored] == [
        request_numbers.request_hash(request_id) for _, request_id, _ in stored
    ]
    found = inspect(engine)
    unique = {tuple(key["column_names"]) for key in found.get_unique_constraints("kv_request")}
    unique |= {tuple(i["column_names"]) for i in found.get_indexes("kv_request") if i["unique"]}
    assert unique == {("request_no", "trace_id", "span_id")}
    assert "ix_request_request_no" not in {i["name"] for i in found.get_indexes("kv_request")}
    assert not found.get_unique_constraints("request_number")
    assert [i["name"] for i in found.get_indexes("request_number")] == ["ix_request_number_hash"]

    # The final row replaces the stub stored before; a retry of the row of no request id
    # (numbered NO_REQUEST) is the same row; a new request follows the numbers kept.
    _write(engine, [_row("ff", VLLM_ID, "finished"), _row("ee", None, "finished")])
    _write(engine, [_row("ee", None, "finished"), _row("dd", "new", "finished")])
    assert _requests(engine) == [
        (0, "ee", "finished"),
        (2, "ff", "finished"),
        (3, "dd", "finished"),
    ]


def test_requests_whose_ids_share_a_hash_keep_numbers_of_their_own(engine, monkeypatch):
    monkeypatch.setattr(request_numbers, "request_hash", lambda request_id: 7)
    with engine.begin() as connection:
        first = request_numbers.assign(BulkCursor(connection), [("e1", "a"), ("e1", "b")])
    with engine.begin() as connection:
        again = request_numbers.assign(BulkCursor(connection), [("e1", "b"), ("", "a")])
    assert again[("e1", "b")] == first[("e1", "b")]
    assert len({*first.values(), *again.values()}) == 3
    with Session(engine) as session:
        assert session.scalars(request_numbers.numbers_of("a", ["e1"])).all() == [
            first[("e1", "a")]
        ]
        pairs = request_numbers.numbers_of_pairs([("", "a")])
        assert session.scalars(pairs).all() == [again[("", "a")]]


def test_a_request_row_of_no_request_id_sent_again_stays_one_row(engine):
    for _ in range(2):
        _write(engine, [_row("ee", None, "finished")])
    assert _requests(engine) == [(request_numbers.NO_REQUEST, "ee", "finished")]
