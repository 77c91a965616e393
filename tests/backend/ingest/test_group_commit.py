"""Group commit on SQLite: batches that queue for the writer share one transaction, every one
is stored before its writer returns, and a bad batch in a group fails alone."""

import copy
import threading

import pytest
from sqlalchemy import event, text

from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import migrate
from kvscope.backend.ingest.bound import Limits
from kvscope.backend.ingest.commit import Committer
from kvscope.backend.ingest.prepare import prepare
from kvscope.bench.backend.scale_spans import Batches

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def engine(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/group.db")
    migrate(engine)
    commits = []
    event.listen(engine, "commit", lambda _connection: commits.append(1))
    engine.commits = commits
    yield engine
    engine.dispose()


def _prepared(count: int):
    batches = Batches(count * 520)
    return [
        prepare(batches.body(b), "application/x-protobuf", Limits()) for b in range(batches.count)
    ]


def _write_queued(writer: Committer, batches) -> list:
    """Each batch written by its own thread while the writer is busy, then let go at once."""
    outcomes: list = [None] * len(batches)

    def write(index: int) -> None:
        try:
            outcomes[index] = writer.commit(batches[index])
        except Exception as error:  # noqa: BLE001  (the outcome under test)
            outcomes[index] = error

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(batches))]
    with writer.lock:  # a transaction in progress: the others queue
        for thread in threads:
            thread.start()
        while len(writer._queue) < len(batches):
            threading.Event().wait(0.01)
    for thread in threads:
        thread.join(timeout=60)
    return outcomes


def _stored_spans(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT COUNT(*) FROM span")).scalar_one()


def test_queued_batches_share_one_commit_and_all_are_stored(engine):
    batches = _prepared(6)
    outcomes = _write_queued(Committer(engine, 10), batches)
    assert [o.spans for o in outcomes] == [len(b.facts.spans) for b in batches]
    assert _stored_spans(engine) == sum(len(b.facts.spans) for b in batches)
    assert len(engine.commits) == 1


def test_without_group_commit_each_batch_commits_alone(engine):
    batches = _prepared(3)
    _write_queued(Committer(engine, 10, group=False), batches)
    assert len(engine.commits) == 3


def test_a_bad_batch_in_a_group_fails_alone(engine):
    batches = _prepared(4)
    bad = copy.deepcopy(batches[2])
    bad.facts.spans[0] = (None,) + tuple(bad.facts.spans[0][1:])  # NULL trace id: refused
    batches[2] = bad
    outcomes = _write_queued(Committer(engine, 10), batches)
    assert isinstance(outcomes[2], Exception)
    assert [o.spans for i, o in enumerate(outcomes) if i != 2] == [
        len(b.facts.spans) for i, b in enumerate(batches) if i != 2
    ]
    assert _stored_spans(engine) == sum(len(b.facts.spans) for i, b in enumerate(batches) if i != 2)
