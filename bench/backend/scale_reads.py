"""The scale bench's reads with N spans stored: the dashboard's timeline, summary and series
as the app serves them, and the summary's span count both ways."""

import random
import statistics
import time

from fastapi.testclient import TestClient

from kvscope.backend.db import span_counts
from kvscope.backend.db.database import make_engine


def p95_ms(client: TestClient, paths: list[str]) -> tuple[float, float]:
    """(p50, p95) in ms of GETting each path once, in order."""
    took = []
    for path in paths:
        started = time.perf_counter()
        response = client.get(path)
        took.append((time.perf_counter() - started) * 1e3)
        if response.status_code != 200:
            raise SystemExit(f"GET {path}: {response.status_code} {response.text[:200]}")
    cuts = statistics.quantiles(took, n=20, method="inclusive")
    return statistics.median(took), cuts[18]


def reads(client: TestClient, samples: int, end_ns: int) -> dict[str, tuple[float, float]]:
    """The dashboard's reads with everything stored: a request's timeline, summary, series.

    The stored stream ended at end_ns, when the fill began; the fill took a while since. The
    windows are widened by that lag, so they hold the rows a 300 s (summary) and 900 s
    (series, 15 s steps) window held when the stream ended: an empty window would time nothing.
    """
    newest = client.get("/api/v1/requests", params={"limit": 1}).json()["items"][0]["id"]
    keys = [random.randint(1, newest) for _ in range(samples)]
    timelines = [f"/api/v1/requests/{key}/timeline" for key in keys]
    found = {"timeline": p95_ms(client, [p for p in timelines if _exists(client, p)])}
    lag_s = max(0.0, (time.time_ns() - end_ns) / 1e9) + samples  # the reads take time too
    summary = f"/api/v1/stats/summary?window_s={300 + lag_s:.0f}"
    found["summary"] = p95_ms(client, [summary] * samples)
    series = f"/api/v1/stats/series?window_s={900 + lag_s:.0f}&step_s=15"
    found["series"] = p95_ms(client, [series] * samples)
    print(f"  windows widened by {lag_s:.0f} s (the fill's time): {summary}, {series}")
    return found


def count_ways(
    url: str, samples: int, since_ns: int, until_ns: int
) -> tuple[int, dict[str, float]]:
    """The summary's span count both ways over one window, alternating: COUNT(*) over the
    span table (before migration 9) and the per-second rollups with the edges counted.
    Returns the count and each way's p95 in ms."""
    engine = make_engine(url)
    took: dict[str, list[float]] = {"table": [], "rollups": []}
    bounds = {"since": since_ns, "until": until_ns}
    with engine.connect() as connection:
        for _ in range(samples):
            started = time.perf_counter()
            table = connection.execute(span_counts.COUNTED, bounds).scalar_one()
            took["table"].append((time.perf_counter() - started) * 1e3)
            started = time.perf_counter()
            rolled = span_counts.in_window(connection, since_ns, until_ns)
            took["rollups"].append((time.perf_counter() - started) * 1e3)
    engine.dispose()
    if rolled != table:
        raise SystemExit(f"the rollups count {rolled:,} spans in the window, the table {table:,}")
    return table, {
        way: statistics.quantiles(ms, n=20, method="inclusive")[18] for way, ms in took.items()
    }


def _exists(client: TestClient, path: str) -> bool:
    return client.get(path).status_code == 200
