"""PostgreSQL at scale, on a real server: 32-bit ids migrated to 64 bits, backends starting
together, two backends writing one process's seq ranges, NUL in text (SQLite too where it
applies)."""

import threading
import time
import uuid

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from sqlalchemy import Integer, MetaData, create_engine, text
from sqlmodel import SQLModel

from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import VERSION_TABLE, _stamp, latest_version, migrate
from kvscope.backend.settings import Settings
from kvscope.traces import names
from tests.backend.conftest import POSTGRES_URL, SKIP_POSTGRES, RunningBackend, otlp_json
from tests.backend.conftest import _throwaway_postgres_database as throwaway
from tests.backend.story import Process

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def postgres_url():
    if not POSTGRES_URL:
        pytest.skip(SKIP_POSTGRES)
    databases = throwaway(POSTGRES_URL)
    yield next(databases)
    next(databases, None)


def _int4_schema(url: str) -> None:
    """The tables as kvscope 1 made them: SERIAL (int4) ids, stamped version 1."""
    old = MetaData()
    for table in SQLModel.metadata.sorted_tables:
        copy = table.to_metadata(old)
        if "id" in copy.columns:
            copy.columns["id"].type = Integer()
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as connection:
        old.create_all(connection)
        connection.execute(
            text(
                f"CREATE TABLE {VERSION_TABLE} (version INTEGER PRIMARY KEY, "
                "description TEXT NOT NULL, applied_ns BIGINT NOT NULL)"
            )
        )
        _stamp(connection, 1, "as kvscope 1 made it")
    engine.dispose()


def _id_types(engine) -> tuple[set, set]:
    with engine.connect() as connection:
        columns = connection.execute(
            text(
                "SELECT data_type FROM information_schema.columns WHERE column_name = 'id' "
                "AND table_schema = current_schema()"
            )
        ).scalars()
        sequences = connection.execute(
            text("SELECT data_type FROM information_schema.sequences")
        ).scalars()
        return set(columns), set(sequences)


def _story(engine_id: str, origin: str | None = None, count: int = 1, **attributes) -> list:
    process = Process("vllm-prefill", engine_id, "scheduler", origin or f"proc-{engine_id}")
    now = time.time_ns()
    for index in range(count):
        span = process.start(
            names.SPAN_REQUEST, now + index, **{names.REQUEST_ID: f"req-{index}", **attributes}
        )
        span.end(end_time=now + index + 1000)
    return process.spans()


def test_an_int4_schema_migrates_to_bigint_ids_and_stores_past_2_to_the_31(postgres_url):
    _int4_schema(postgres_url)
    engine = make_engine(postgres_url)
    assert _id_types(engine) == ({"integer"}, {"integer"})
    assert migrate(engine) == latest_version()
    assert _id_types(engine) == ({"bigint"}, {"bigint"})
    with engine.begin() as connection:
        connection.execute(text("SELECT setval(pg_get_serial_sequence('span', 'id'), 2147483653)"))
    engine.dispose()
    with RunningBackend(Settings(database_url=postgres_url, ingest_workers=0)) as backend:
        assert backend.export(_story("engine-big", count=3)) == SpanExportResult.SUCCESS
        ids = backend.app.state.engine.connect().execute(text("SELECT id FROM span")).scalars()
        assert min(ids) > 2**31


def test_two_backends_starting_together_migrate_once(postgres_url):
    for _ in range(3):
        databases = throwaway(POSTGRES_URL)
        url = next(databases)
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def start(url=url, barrier=barrier, errors=errors) -> None:
            engine = make_engine(url)
            try:
                barrier.wait(10)
                migrate(engine)
            except BaseException as error:  # reported below, in the test's thread
                errors.append(error)
            finally:
                engine.dispose()

        threads = [threading.Thread(target=start) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert errors == []
        engine = make_engine(url)
        with engine.connect() as connection:
            stamped = connection.execute(text(f"SELECT version FROM {VERSION_TABLE}")).all()
        engine.dispose()
        assert stamped == [(latest_version(),)]
        next(databases, None)


def test_two_backends_merge_one_process_seq_ranges_without_losing_or_doubling(postgres_url):
    origin = f"proc-{uuid.uuid4().hex[:10]}"
    spans = _story("engine-shared", origin=origin, count=400)
    batches = [spans[start : start + 2] for start in range(0, len(spans), 2)]
    settings = Settings(database_url=postgres_url, ingest_workers=0)
    with RunningBackend(settings) as first, RunningBackend(settings) as second:

        def send(backend, mine) -> None:
            for batch in mine:
                assert backend.export(batch) == SpanExportResult.SUCCESS

        # Four senders, two per backend: merges of one process overlap all the time.
        threads = [
            threading.Thread(target=send, args=(backend, batches[index::4]))
            for index, backend in enumerate((first, second, first, second))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        with first.client() as client:
            streams = client.get("/api/v1/streams").json()
        with first.app.state.engine.connect() as connection:
            ranges = connection.execute(
                text("SELECT lo, hi FROM seqrange WHERE instance_id = :origin"),
                {"origin": origin},
            ).all()
    assert ranges == [(0, len(spans) - 1)]
    stream = next(item for item in streams if item["origin"] == origin)
    assert stream["received"] == len(spans) and stream["holes"] == []


def test_nul_in_a_string_attribute_is_stored_replaced_and_counted(make_backend):
    backend = make_backend()
    engine_id = f"engine-{uuid.uuid4().hex[:6]}"
    spans = _story(engine_id, **{"kvscope.note": "bad\x00text", names.CONNECTOR_NAME: "Off\x00"})
    assert backend.export(spans) == SpanExportResult.SUCCESS
    with backend.client() as client:
        found = client.get("/api/v1/requests", params={"engine_id": engine_id}).json()
        assert found["total"] == 1 and found["items"][0]["connector"] == "Off\ufffd"
    # The exporter's answer says so too (partial success with no span rejected).
    answer = backend.client().post("/v1/traces", json=otlp_json(spans))
    assert answer.status_code == 200
    assert "U+FFFD" in answer.json()["partialSuccess"]["errorMessage"]
