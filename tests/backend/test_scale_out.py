"""Two backends on one PostgreSQL database, each given half the demo stream, serve one state."""

import threading
import time

import pytest

from tests.backend.conftest import POSTGRES_URL, SKIP_POSTGRES, RunningBackend
from tests.backend.conftest import _throwaway_postgres_database as throwaway
from tests.backend.served_state import differences, recorded_bodies, served_state, settings_for

pytestmark = pytest.mark.timeout(300)

SEND_TIMEOUT_S = 150
MAX_TRIES = 20


@pytest.fixture
def database_urls():
    """Two fresh databases: one shared by two backends, one for the backend given everything."""
    if not POSTGRES_URL:
        pytest.skip(SKIP_POSTGRES)
    databases = [throwaway(POSTGRES_URL), throwaway(POSTGRES_URL)]
    yield [next(database) for database in databases]
    for database in databases:
        next(database, None)  # drops it


def _send(backend: RunningBackend, bodies: list[bytes], start: threading.Barrier, answered: list):
    """POSTs each batch in order; a 503 (busy, or a transaction the database rolled back) is
    retried as an OTLP exporter retries it."""
    start.wait(30)
    with backend.client() as client:
        for body in bodies:
            for tries in range(MAX_TRIES):
                answer = client.post(
                    "/v1/traces", content=body, headers={"Content-Type": "application/json"}
                )
                if answer.status_code != 503:
                    break
                time.sleep(0.05 * (tries + 1))
            assert answer.status_code == 200, answer.text
            answered.append(tries)


def _spans_stored(backend: RunningBackend) -> int:
    with backend.client() as client:
        return client.get("/health").raise_for_status().json()["spans_stored_since_start"]


def test_two_backends_on_one_database_serve_what_one_backend_serves(database_urls):
    """Alternate batches of the demo recording (so a trace's spans are split) go to two
    backends on one database at once; the whole stream goes to a third backend on its own."""
    shared_url, single_url = database_urls
    bodies = recorded_bodies()
    with (
        RunningBackend(settings_for(shared_url)) as first,
        RunningBackend(settings_for(shared_url)) as second,
        RunningBackend(settings_for(single_url)) as single,
    ):
        start = threading.Barrier(3)
        answered: list[int] = []  # tries each batch took
        senders = [
            threading.Thread(target=_send, args=(backend, half, start, answered))
            for backend, half in ((first, bodies[0::2]), (second, bodies[1::2]), (single, bodies))
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(SEND_TIMEOUT_S)
        # Each batch is answered after its commit: every answer in means every span stored.
        assert len(answered) == 2 * len(bodies), "a sender failed or timed out: see its error"
        stored = [_spans_stored(backend) for backend in (first, second, single)]
        assert stored[0] > 0 and stored[1] > 0 and stored[0] + stored[1] == stored[2]

        want = served_state(single)
        assert want["summary"]["spans"] == stored[2] and want["timelines"] and want["incidents"]
        for backend in (first, second):
            assert differences(served_state(backend), want) == []
