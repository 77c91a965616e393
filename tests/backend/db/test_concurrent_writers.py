"""Two writers of one request's rows, both transactions open at once, keep the serial rollups."""

import threading
import time
import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, text

from kvscope.backend.db import request_locks
from kvscope.backend.db.bulk import add_postgres_stages
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import migrate
from kvscope.backend.ingest.derive import derive
from kvscope.backend.ingest.facts import Facts
from kvscope.backend.ingest.record import Decoded, SpanRecord
from kvscope.backend.ingest.write import STAGED_TABLES, write_rows
from kvscope.traces import names
from tests.backend.conftest import POSTGRES_URL, SKIP_POSTGRES, _throwaway_postgres_database

pytestmark = pytest.mark.timeout(120)

S = 1_000_000_000
T0 = 1_800_000_000 * S  # a whole second
WAIT_S = 30.0
"""The longest any step waits for another thread."""
SQLITE_RACE_S = 0.5
"""SQLite shows no lock wait: the second writer is taken as blocked if not done by then."""

LOOKUP = names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens"
ALLOC = names.SPAN_HOOK_PREFIX + "update_state_after_alloc"


@pytest.fixture(scope="module")
def engine(database_url):
    engine = make_engine(database_url)
    add_postgres_stages(engine, STAGED_TABLES)
    migrate(engine)
    yield engine
    engine.dispose()


class Story:
    """Spans of one request (its own trace) on one engine, derived into batches' rows."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id
        self.trace_id = uuid.uuid4().hex
        self.request_span_id = uuid.uuid4().hex[:16]

    def batch(self, *spans: tuple[str, int, dict]) -> Facts:
        """(span name, end time, attributes) each; hooks are children of the request span."""
        records = [self._span(name, end_ns, attributes) for name, end_ns, attributes in spans]
        return derive(Decoded(spans=records), time.time_ns())

    def _span(self, name: str, end_ns: int, attributes: dict) -> SpanRecord:
        own = name == names.SPAN_REQUEST
        return SpanRecord(
            trace_id=self.trace_id,
            span_id=self.request_span_id if own else uuid.uuid4().hex[:16],
            parent_span_id=None if own else self.request_span_id,
            name=name,
            kind=1,
            start_ns=end_ns - S // 10,
            end_ns=end_ns,
            status_code=0,
            status_message=None,
            attributes={names.REQUEST_ID: "req-0", **attributes},
            events=[],
            links=[],
            instance_id=None,
            service_name=None,
            engine_id=self.engine_id,
        )


def _lookup(at_s: float, hit: int, request_id: str = "req-0") -> tuple[str, int, dict]:
    attributes = {
        names.REQUEST_ID: request_id,
        names.CONNECTOR_NAME: "OffloadingConnector",
        names.TOKENS_EXTERNAL_HIT: hit,
    }
    return LOOKUP, T0 + int(at_s * S), attributes


def _prompt(tokens: int) -> tuple[str, int, dict]:
    return names.SPAN_REQUEST, T0 + 5 * S, {names.PROMPT_TOKENS: tokens}


def _allocated(at_s: float) -> tuple[str, int, dict]:
    return ALLOC, T0 + int(at_s * S), {names.TOKENS_TO_LOAD: 64}


def _loaded(at_s: float) -> tuple[str, int, dict]:
    point = {names.TIMELINE_POINT: "transfer_complete"}
    return names.SPAN_REQUEST_EVENT, T0 + int(at_s * S) + S // 10, point


def _many_lookups() -> list[tuple[str, int, dict]]:
    """One batch of more requests than get a lock each: it holds the one for every request."""
    return [_lookup(1, 192)] + [
        _lookup(1, 16, f"other-{n}") for n in range(request_locks.MAX_REQUEST_LOCKS)
    ]


# The request's rows in two batches: (first, second). Each trigger of a row reads its request's
# other rows, so the second batch's rows must see the first's, whichever commits first.
CASES: dict[str, Callable[[Story], tuple[Facts, Facts]]] = {
    "a later lookup replaces the counted one": lambda story: (
        story.batch(_lookup(1, 192)),
        story.batch(_lookup(2, 0)),
    ),
    "the prompt reaches a lookup written meanwhile": lambda story: (
        story.batch(_lookup(1, 192)),
        story.batch(_prompt(1000)),
    ),
    "the KV wait joins allocation and load": lambda story: (
        story.batch(_allocated(1)),
        story.batch(_loaded(1.5)),
    ),
    "a batch of many requests against one of them": lambda story: (
        story.batch(*_many_lookups()),
        story.batch(_lookup(2, 0)),
    ),
}


def _stored_first_hook(engine: Engine, story: Story) -> None:
    """The request's 'running' row, from an earlier batch: both racing batches find it stored."""
    _commit(engine, story.batch((ALLOC, T0, {})))


def _commit(engine: Engine, facts: Facts) -> None:
    with engine.begin() as connection:
        write_rows(connection, facts, {}, time.time_ns())


def _rollups(engine: Engine, engine_id: str) -> list[tuple]:
    """The engine's rollup rows that count something, without the engine."""
    with engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT metric, bucket_ns, label, samples, positives, total, extra "
                "FROM series_rollup WHERE engine_id = :engine_id "
                "AND (samples != 0 OR positives != 0 OR total != 0 OR extra != 0)"
            ),
            {"engine_id": engine_id},
        )
        return sorted(tuple(row) for row in rows)


def _waits_for_a_lock(engine: Engine, pid: int | None) -> bool:
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT count(*) FROM pg_locks WHERE pid = :pid AND NOT granted"), {"pid": pid}
        )
        return found.scalar_one() > 0


class Writer(threading.Thread):
    """Writes one batch in its own transaction; with `hold`, commits only once it is set."""

    def __init__(self, engine: Engine, facts: Facts, hold: threading.Event | None = None):
        super().__init__(daemon=True)
        self.engine, self.facts, self.hold = engine, facts, hold
        self.pid: int | None = None
        self.started_writing, self.written = threading.Event(), threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.engine.begin() as connection:
                if connection.dialect.name == "postgresql":
                    self.pid = connection.connection.dbapi_connection.info.backend_pid
                self.started_writing.set()
                write_rows(connection, self.facts, {}, time.time_ns())
                self.written.set()
                if self.hold is not None and not self.hold.wait(WAIT_S):
                    raise TimeoutError("the test never let this writer commit")
        except BaseException as error:
            self.error = error

    def finish(self) -> None:
        self.join(WAIT_S)
        assert not self.is_alive(), "a writer did not finish"
        if self.error is not None:
            raise self.error


def _blocked_or_written(engine: Engine, writer: Writer) -> bool:
    """Waits until the writer has written its rows or waits for a lock (a timeout fails)."""
    assert writer.started_writing.wait(WAIT_S)
    postgres = engine.dialect.name == "postgresql"
    deadline = time.monotonic() + (WAIT_S if postgres else SQLITE_RACE_S)
    while time.monotonic() < deadline:
        if writer.written.wait(0.01):
            return False
        if postgres and _waits_for_a_lock(engine, writer.pid):
            return True
    assert not postgres, "the second writer neither wrote nor waited for a lock"
    return True


def _race(engine: Engine, first: Facts, second: Facts) -> bool:
    """`first` written, left open while `second` is written on another connection, committed
    once `second` has written or waits; then `second` commits. True if `second` waited."""
    release = threading.Event()
    holder, racer = Writer(engine, first, release), Writer(engine, second)
    holder.start()
    try:
        assert holder.written.wait(WAIT_S), f"the first writer did not write: {holder.error}"
        racer.start()
        waited = _blocked_or_written(engine, racer)
    finally:
        release.set()
        holder.finish()
    racer.finish()
    return waited


@pytest.mark.parametrize("case", CASES)
def test_racing_writers_of_one_request_keep_the_serial_rollups(engine, case):
    _race_against_serial(engine, case)


def _race_against_serial(engine: Engine, case: str) -> None:
    serial, racing = Story(f"serial: {case}"), Story(f"racing: {case}")
    for story in (serial, racing):
        _stored_first_hook(engine, story)
    for facts in CASES[case](serial):
        _commit(engine, facts)
    want = _rollups(engine, serial.engine_id)
    assert want, "the serial writes rolled up nothing"

    waited = _race(engine, *CASES[case](racing))

    assert _rollups(engine, racing.engine_id) == want
    assert waited  # SQLite: its single writer waits; PostgreSQL: the request's lock


def test_racing_writers_of_a_new_request_give_it_one_number(engine):
    """Neither batch finds the request numbered, and the number table has no unique key on
    the request id: the second waits for the first and takes its number (request_locks)."""
    story = Story("racing: a new request")
    assert _race(engine, story.batch(_lookup(1, 192)), story.batch(_lookup(2, 0)))
    with engine.connect() as connection:
        numbers = connection.execute(
            text("SELECT COUNT(*) FROM request_number WHERE engine_id = :e AND request_id = :r"),
            {"e": story.engine_id, "r": "req-0"},
        )
        assert numbers.scalar_one() == 1


def test_writers_of_different_requests_do_not_wait_for_each_other(engine):
    """The locks are per request: two backends' batches of other requests go in together."""
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has one writer at a time")
    one, other = Story("apart: one"), Story("apart: other")
    for story in (one, other):
        _stored_first_hook(engine, story)
    assert not _race(engine, one.batch(_lookup(1, 192)), other.batch(_lookup(2, 0)))
    assert _rollups(engine, other.engine_id) == [("hit", T0 + 2 * S, "", 1, 0, 0, 0)]


def _advisory_locks_held(engine: Engine, facts: Facts) -> int:
    with engine.connect() as connection, connection.begin():
        write_rows(connection, facts, {}, time.time_ns())
        found = connection.execute(
            text(
                "SELECT count(*) FROM pg_locks "
                "WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
            )
        )
        return found.scalar_one()


def test_locks_per_transaction_stay_bounded(engine):
    """A batch of many requests holds one lock, not one per request: PostgreSQL's lock table
    is shared by every session and fixed in size."""
    if engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's advisory locks")
    few = Story("bounded: few").batch(_lookup(1, 1), _lookup(1, 2, "req-1"))
    assert _advisory_locks_held(engine, few) == 3  # every request's, shared with many's
    many = Story("bounded: many").batch(*_many_lookups())
    assert _advisory_locks_held(engine, many) == 1


def test_a_process_keeps_its_earliest_and_latest_sighting(engine):
    """Batches commit out of the order they were received (ingest workers, two backends)."""
    origin = f"process-{uuid.uuid4().hex[:8]}"
    for received_s in (2, 3, 1):
        facts = Facts(origins={origin: ("vllm", "engine-0", "kv_both")})
        with engine.begin() as connection:
            write_rows(connection, facts, {}, T0 + received_s * S)
    with engine.connect() as connection:
        found = connection.execute(
            text("SELECT first_seen_ns, last_seen_ns FROM process WHERE instance_id = :origin"),
            {"origin": origin},
        )
        assert tuple(found.one()) == (T0 + S, T0 + 3 * S)


def test_the_locks_hold_on_a_server_whose_default_isolation_is_stricter():
    """Under REPEATABLE READ a writer that waited would still not see what the other committed:
    the backend's engine asks for READ COMMITTED whatever the server's default."""
    if not POSTGRES_URL:
        pytest.skip(SKIP_POSTGRES)
    import psycopg

    database = _throwaway_postgres_database(POSTGRES_URL)
    url = next(database)
    engine = make_engine(url)
    try:
        raw_url = url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(raw_url, autocommit=True) as connection:
            name = url.rpartition("/")[2]
            connection.execute(
                f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'"
            )
        add_postgres_stages(engine, STAGED_TABLES)
        migrate(engine)
        _race_against_serial(engine, "a later lookup replaces the counted one")
    finally:
        engine.dispose()
        next(database, None)  # drops it
