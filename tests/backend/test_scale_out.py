"""Two backends on one PostgreSQL database, each given half the demo stream, serve one state."""

import json
import threading
import time

import pytest

from kvscope.backend.settings import Settings
from kvscope.demo.replay import RECORDINGS, latest_end_ns, recorded_lines, shift_times
from tests.backend.conftest import POSTGRES_URL, SKIP_POSTGRES, RunningBackend
from tests.backend.conftest import _throwaway_postgres_database as throwaway

pytestmark = pytest.mark.timeout(300)

WINDOW_S = 10**6
"""Summary window: the whole replayed recording, which ends now."""

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


def _settings(url: str) -> Settings:
    # Server clocks kept out of the state: a process silent for engine_lost_after_s is closed
    # as 'engine lost' at the next retention pass, and a seq hole turns from pending to
    # missing after gap_grace_s; both depend on when each backend happened to receive and prune.
    return Settings(
        database_url=url, ingest_workers=0, engine_lost_after_s=3600.0, gap_grace_s=3600.0
    )


def _bodies() -> list[bytes]:
    """The recording's batches, moved (once, for every backend) to end now."""
    lines = recorded_lines(RECORDINGS / "demo.jsonl.gz")
    delta_ns = time.time_ns() - latest_end_ns(lines)
    bodies = []
    for line in lines:
        body = json.loads(line)
        shift_times(body, delta_ns)
        bodies.append(json.dumps(body).encode())
    return bodies


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


def _pages(client, path: str, **params) -> tuple[dict, list[dict]]:
    """Every item of a paged route, and its last page (totals, certainty)."""
    items: list[dict] = []
    while True:
        found = client.get(path, params={**params, "offset": len(items), "limit": 1000})
        found = found.raise_for_status().json()
        items += found["items"]
        if not found["items"] or len(items) >= found["total"]:
            return found, items


def _canonical(items: list) -> list:
    # Rows tied on a route's sort key (start or event time) fall back to row id order, which is
    # insertion order: two writers interleave it differently from one.
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))


def _without(item: dict, *keys: str) -> dict:
    return {key: value for key, value in item.items() if key not in keys}


def _summary(answer) -> dict:
    # since_ns is the query's clock minus the window. A mean throughput is AVG over float
    # rows, summed in the order the database stores them: its last bits vary with that order.
    summary = _without(answer.raise_for_status().json(), "since_ns")
    for transfers in summary["transfers"].values():
        transfers["mean_gbps"] = float(f"{transfers['mean_gbps']:.9g}")
    return summary


def _certainty(certainty: dict) -> dict:
    # A hole's age is from when the backend received the run after it, until the query.
    gaps = [_without(gap, "age_s") for gap in certainty["gaps"]]
    return {**certainty, "gaps": _canonical(gaps)}


def _lease(lease: dict) -> dict:
    # A held lease's age and whether it is overdue are read against the query's clock.
    return _without(lease, "age_s", "overdue") if lease["active"] else lease


def _timeline(timeline: dict) -> dict:
    # Row ids (the request's, its transfers' and failures') are each database's own numbering.
    return {
        **timeline,
        "request": _without(timeline["request"], "id"),
        "points": _canonical(timeline["points"]),
        "transfers": _canonical([_without(t, "id") for t in timeline["transfers"]]),
        "failures": _canonical([_without(f, "id") for f in timeline["failures"]]),
        "certainty": _certainty(timeline["certainty"]),
    }


def _served_state(backend: RunningBackend) -> dict:
    """What the backend's routes serve, less what legitimately differs between databases."""
    with backend.client() as client:
        summary = _summary(client.get("/api/v1/stats/summary", params={"window_s": WINDOW_S}))
        engines = [
            # last_seen_ns is the backend's receive time; processes are listed in the order
            # each backend first received them.
            {**_without(engine, "last_seen_ns"), "instance_ids": sorted(engine["instance_ids"])}
            for engine in client.get("/api/v1/stats/engines").raise_for_status().json()
        ]
        leases_page, leases = _pages(client, "/api/v1/leases")
        blocks_page, blocks = _pages(client, "/api/v1/blocks")
        _, failures = _pages(client, "/api/v1/failures")
        incidents_page, incidents = _pages(client, "/api/v1/failures/incidents")
        streams = [
            # A hole's age is from the backend's receipt of the run after it.
            {**stream, "holes": [_without(hole, "age_s") for hole in stream["holes"]]}
            for stream in client.get("/api/v1/streams").raise_for_status().json()
        ]
        _, requests = _pages(client, "/api/v1/requests")
        timelines = [
            _timeline(client.get(f"/api/v1/requests/{r['id']}/timeline").raise_for_status().json())
            for r in requests
        ]
    return {
        "summary": summary,
        "engines": _canonical(engines),
        "streams": _canonical(streams),
        "leases": _canonical([_lease(lease) for lease in leases]),
        "leases_certainty": _certainty(leases_page["certainty"]),
        "blocks": _canonical(blocks),
        "blocks_certainty": _certainty(blocks_page["certainty"]),
        # Failure reports' and incidents' ids are row ids (an incident's: its first report's).
        "failures": _canonical([_without(f, "id") for f in failures]),
        "incidents": _canonical([_without(i, "id") for i in incidents]),
        "incident_reports": (incidents_page["reports"], incidents_page["truncated"]),
        "requests": _canonical([_without(r, "id") for r in requests]),
        "timelines": _canonical(timelines),
    }


def _differences(got: dict, want: dict) -> list[str]:
    """Which parts differ, with a list's first differing item, a dict's differing key paths."""
    found = []
    for part, value in want.items():
        if got[part] == value:
            continue
        if isinstance(value, list):
            extra = [item for item in got[part] if item not in value][:1]
            lacking = [item for item in value if item not in got[part]][:1]
            found.append(f"{part}: {len(got[part])} vs {len(value)}, {extra} != {lacking}")
        elif isinstance(value, dict):
            found += _differing_paths(got[part], value, part)
        else:
            found.append(f"{part}: {got[part]} != {value}")
    return found


_ABSENT = "<absent>"


def _differing_paths(got, want, path: str) -> list[str]:
    """Each nested key path where two dicts differ, with both values there."""
    if not (isinstance(got, dict) and isinstance(want, dict)):
        return [] if got == want else [f"{path}: {got!r} != {want!r}"]
    found = []
    for key in sorted(set(got) | set(want), key=str):
        found += _differing_paths(got.get(key, _ABSENT), want.get(key, _ABSENT), f"{path}.{key}")
    return found


def test_two_backends_on_one_database_serve_what_one_backend_serves(database_urls):
    """Alternate batches of the demo recording (so a trace's spans are split) go to two
    backends on one database at once; the whole stream goes to a third backend on its own."""
    shared_url, single_url = database_urls
    bodies = _bodies()
    with (
        RunningBackend(_settings(shared_url)) as first,
        RunningBackend(_settings(shared_url)) as second,
        RunningBackend(_settings(single_url)) as single,
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

        want = _served_state(single)
        assert want["summary"]["spans"] == stored[2] and want["timelines"] and want["incidents"]
        for backend in (first, second):
            assert _differences(_served_state(backend), want) == []
