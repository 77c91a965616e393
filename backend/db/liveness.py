"""Engines that stopped reporting: a process silent for N telemetry intervals is gone, and its
held leases and running requests are closed as 'engine lost' (not active forever)."""

from sqlalchemy import Connection, text

ENGINE_LOST = "engine_lost"
"""Outcome of a lease and status of a request whose process stopped reporting."""

# Only processes that sent telemetry promised to report periodically; the others (vLLM's own
# API server, replayed tools) may just be idle.
_GONE = text(
    "SELECT instance_id, last_seen_ns FROM process "
    "WHERE telemetry_emitted IS NOT NULL AND last_seen_ns < :cutoff"
)
_CLOSE_LEASES = text(
    "UPDATE lease SET ended_ns = :ended_ns, outcome = :outcome "
    "WHERE instance_id = :instance_id AND ended_ns IS NULL"
)
_CLOSE_REQUESTS = text(
    "UPDATE kv_request SET end_ns = :ended_ns, status = :outcome, status_message = :message "
    "WHERE instance_id = :instance_id AND status = 'running'"
)


def gone_processes(connection: Connection, now_ns: int, lost_after_s: float) -> dict[str, int]:
    """instance id -> when the backend last heard from it, for every gone process."""
    cutoff = now_ns - int(lost_after_s * 1e9)
    return dict(connection.execute(_GONE, {"cutoff": cutoff}).all())


def close_lost(connection: Connection, now_ns: int, lost_after_s: float) -> int:
    """Closes what gone processes left open, at their last sighting; returns rows closed.

    A late span of the process still wins: a lease's earliest end and a request's own span
    replace what is written here.
    """
    closed = 0
    for instance_id, last_seen_ns in gone_processes(connection, now_ns, lost_after_s).items():
        values = {
            "instance_id": instance_id,
            "ended_ns": last_seen_ns,
            "outcome": ENGINE_LOST,
            "message": f"process {instance_id} stopped reporting",
        }
        closed += connection.execute(_CLOSE_LEASES, values).rowcount
        closed += connection.execute(_CLOSE_REQUESTS, values).rowcount
    return closed
