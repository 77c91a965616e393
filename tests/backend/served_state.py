"""The state a backend serves, compared across databases: the demo recording's batches moved to
end now, settings without server clocks, every route's answer less what legitimately differs."""

import json
import time

from kvscope.backend.settings import Settings
from kvscope.demo.replay import RECORDINGS, latest_end_ns, recorded_lines, shift_times
from tests.backend.conftest import RunningBackend

WINDOW_S = 10**6
"""Summary window: the whole replayed recording, which ends now."""


def settings_for(url: str) -> Settings:
    # Server clocks kept out of the state: a process silent for engine_lost_after_s is closed
    # as 'engine lost' at the next retention pass, and a seq hole turns from pending to
    # missing after gap_grace_s; both depend on when each backend happened to receive and prune.
    return Settings(
        database_url=url, ingest_workers=0, engine_lost_after_s=3600.0, gap_grace_s=3600.0
    )


def recorded_bodies() -> list[bytes]:
    """The recording's batches, moved (once, for every backend) to end now."""
    lines = recorded_lines(RECORDINGS / "demo.jsonl.gz")
    delta_ns = time.time_ns() - latest_end_ns(lines)
    bodies = []
    for line in lines:
        body = json.loads(line)
        shift_times(body, delta_ns)
        bodies.append(json.dumps(body).encode())
    return bodies


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


def served_state(backend: RunningBackend) -> dict:
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


def differences(got: dict, want: dict) -> list[str]:
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
