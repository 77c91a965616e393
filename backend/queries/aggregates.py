"""SQL aggregates over a time window, as named statements with bound parameters.

Each statement reads a range of one time index (and point lookups by request): its cost
grows with the window's rows, never with the table. Percentiles are taken in Python from
plain numbers the database selected (SQLite has no percentile function).
"""

import statistics

from sqlalchemy import Connection, text

# Each request's last decided lookup per connector and child (a lookup may be repeated
# until it decides), with its prompt length from the request rows of the same number (the
# same request id on the same engine: backend/db/request_numbers.py).
LAST_LOOKUPS = text(
    "SELECT connector, child, time_ns, hit_tokens, "
    "(SELECT MAX(r.prompt_tokens) FROM kv_request r WHERE r.request_no = ranked.request_no) "
    "AS prompt "
    "FROM (SELECT engine_id, request_id, request_no, connector, child, time_ns, hit_tokens, "
    "  ROW_NUMBER() OVER (PARTITION BY engine_id, request_id, connector, child "
    "                     ORDER BY time_ns DESC, id DESC) AS n "
    "  FROM lookup WHERE time_ns >= :since AND time_ns < :until) ranked "
    "WHERE n = 1"
)

HITS_BY_CONNECTOR = text(
    "SELECT connector, child, COUNT(*), "
    "SUM(CASE WHEN hit_tokens > 0 THEN 1 ELSE 0 END), SUM(hit_tokens), "
    "SUM(COALESCE(prompt, 0)) "
    f"FROM ({LAST_LOOKUPS.text}) last GROUP BY connector, child"
)

TTFT_SAMPLES = text(
    "SELECT time_ns, ttft_ms FROM latency "
    "WHERE time_ns >= :since AND time_ns < :until AND ttft_ms IS NOT NULL"
)

TRANSFERS_BY_DIRECTION = text(
    "SELECT direction, COUNT(*), COALESCE(SUM(bytes), 0), AVG(gbps), "
    "SUM(CASE WHEN ok THEN 0 ELSE 1 END) "
    "FROM transfer WHERE start_ns >= :since AND start_ns < :until GROUP BY direction"
)

# Leases that were held at some time in the window: still held, or ended in it.
LEASES_IN_WINDOW = text(
    "SELECT acquired_ns, ended_ns FROM lease "
    "WHERE ended_ns IS NULL AND acquired_ns IS NOT NULL AND acquired_ns < :until "
    "UNION ALL SELECT acquired_ns, ended_ns FROM lease "
    "WHERE ended_ns >= :since AND acquired_ns IS NOT NULL AND acquired_ns < :until"
)

# The series' per-second rollups (backend/db/rollups.py), summed per step.
_ROLLED = (
    "FROM series_rollup WHERE metric = :metric AND bucket_ns >= :since AND bucket_ns < :until "
)
ROLLED_HITS = text(
    "SELECT (bucket_ns - :since) / :step, SUM(samples), SUM(positives), SUM(total), "
    f"SUM(extra) {_ROLLED}GROUP BY (bucket_ns - :since) / :step HAVING SUM(samples) > 0"
)
# The summary's external hit tokens: the same rollup over the whole window.
ROLLED_HIT_TOKENS = text(
    "SELECT COALESCE(SUM(total), 0) FROM series_rollup WHERE metric = 'hit' "
    "AND bucket_ns >= :since AND bucket_ns < :until"
)
ROLLED_BY_LABEL = text(
    f"SELECT (bucket_ns - :since) / :step, label, SUM(samples), SUM(total) {_ROLLED}"
    "GROUP BY (bucket_ns - :since) / :step, label HAVING SUM(samples) > 0"
)

REQUESTS_BY_STATUS = text(
    "SELECT status, COUNT(*) FROM kv_request "
    "WHERE start_ns >= :since AND start_ns < :until GROUP BY status"
)
LEASES_HELD = text("SELECT COUNT(*) FROM lease WHERE ended_ns IS NULL")
BLOCKS_BY_STATE = text("SELECT tier, state, COUNT(*) FROM block GROUP BY tier, state")


def window(since_ns: int, until_ns: int, step_ns: int = 1) -> dict:
    return {"since": since_ns, "until": until_ns, "step": max(1, step_ns)}


def percentiles(samples: list[float]) -> tuple[float | None, float | None]:
    """(p50, p95) of the samples; None for none."""
    if not samples:
        return None, None
    if len(samples) == 1:
        return samples[0], samples[0]
    cuts = statistics.quantiles(samples, n=20, method="inclusive")
    return statistics.median(samples), cuts[18]


def rows(connection: Connection, statement, bounds: dict) -> list[tuple]:
    return [tuple(row) for row in connection.execute(statement, bounds)]


def counted(connection: Connection, statement, bounds: dict) -> dict[str, int]:
    return {str(key): int(count) for key, count in connection.execute(statement, bounds)}


def held_at(leases: list[tuple[int, int | None]], times: list[int]) -> list[int]:
    """How many leases were held at each of the (ascending) times; never below 0.

    A lease's end can carry an earlier time than its start (the two are stamped in different
    processes, or a replay shifts them apart): it is then held for no time, never for less."""
    changes = sorted(
        [(acquired, 1) for acquired, _ in leases]
        + [(max(ended, acquired), -1) for acquired, ended in leases if ended is not None]
    )
    held, index, out = 0, 0, []
    for at in times:
        while index < len(changes) and changes[index][0] <= at:
            held += changes[index][1]
            index += 1
        out.append(held)
    return out
