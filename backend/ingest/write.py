"""The write stage: a batch of derived rows into the tables, bulk inserts and order-safe upserts."""

import json
from collections.abc import Iterator

from sqlalchemy import Connection

from kvscope.backend.db import kv_waits, request_locks, request_numbers, seqs, span_counts
from kvscope.backend.db.bulk import DO_NOTHING, BulkCursor
from kvscope.backend.db.models import (
    Block,
    Failure,
    Latency,
    Lease,
    Lookup,
    Process,
    Request,
    Span,
    TimelinePoint,
    Transfer,
)
from kvscope.backend.db.models.columns import table_of
from kvscope.backend.ingest.facts import Facts
from kvscope.backend.ingest.record import SERVICE_NAME, clean
from kvscope.backend.ingest.request_rows import POINT_COLUMNS
from kvscope.backend.ingest.span_row import SPAN_COLUMNS
from kvscope.traces import names

_START, _RECEIVED = SPAN_COLUMNS.index("start_ns"), SPAN_COLUMNS.index("received_ns")
_SPAN_ENGINE, _SPAN_REQUEST = SPAN_COLUMNS.index("engine_id"), SPAN_COLUMNS.index("request_id")
_POINT_ENGINE = POINT_COLUMNS.index("engine_id")
_POINT_REQUEST = POINT_COLUMNS.index("request_id")
_NUMBERED_SPAN_COLUMNS = (*SPAN_COLUMNS, request_numbers.COLUMN)
_NUMBERED_POINT_COLUMNS = (*POINT_COLUMNS, request_numbers.COLUMN)

STAGED_TABLES = tuple(
    table_of(model) for model in (Span, TimelinePoint, Request, Transfer, Failure, Lookup, Latency)
)
"""Insert-only tables: on PostgreSQL their rows go in by COPY through a staging table."""

# The request span itself is the final word; it replaces a 'running' stub.
_REQUEST_KEY = (request_numbers.COLUMN, "trace_id", "span_id")
_REQUEST_UPSERT = f"ON CONFLICT ({', '.join(_REQUEST_KEY)}) DO UPDATE SET {{updates}}"

# Acquire and end events may arrive in either order: each fills in its own columns, and
# the earliest end wins.
_FIRST_END = "(lease.ended_ns IS NULL OR (excluded.ended_ns IS NOT NULL AND excluded.ended_ns < lease.ended_ns))"  # noqa: E501
_LEASE_UPSERT = (
    "ON CONFLICT (engine_id, lease_id) DO UPDATE SET "
    "holder = COALESCE(excluded.holder, lease.holder), "
    "host_block_ids = CASE WHEN excluded.host_block_ids != '[]' "
    "THEN excluded.host_block_ids ELSE lease.host_block_ids END, "
    "acquired_ns = COALESCE(excluded.acquired_ns, lease.acquired_ns), "
    "timeout_s = COALESCE(excluded.timeout_s, lease.timeout_s), "
    f"ended_ns = CASE WHEN {_FIRST_END} THEN excluded.ended_ns ELSE lease.ended_ns END, "
    f"outcome = CASE WHEN {_FIRST_END} AND excluded.ended_ns IS NOT NULL "
    "THEN excluded.outcome ELSE lease.outcome END"
)

# Last event wins by its own timestamp, so late or reordered batches cannot roll back.
_BLOCK_UPSERT = (
    "ON CONFLICT (engine_id, tier, address) DO UPDATE SET state = excluded.state, "
    "updated_ns = excluded.updated_ns, "
    "block_hash = COALESCE(excluded.block_hash, block.block_hash), "
    "instance_id = excluded.instance_id, request_id = excluded.request_id "
    "WHERE excluded.updated_ns >= block.updated_ns"
)


def _largest(column: str) -> str:
    """Counters and clocks only grow: the largest seen is the latest report (NULL = unknown)."""
    new, old = f"excluded.{column}", f"process.{column}"
    return (
        f"{column} = CASE WHEN {old} IS NULL THEN {new} WHEN {new} IS NULL THEN {old} "
        f"WHEN {new} > {old} THEN {new} ELSE {old} END"
    )


# Batches commit out of the order they were received (ingest workers, backends sharing the
# database): a process's sightings keep the earliest and the latest, not the last committed.
_PROCESS_UPSERT = (
    "ON CONFLICT (instance_id) DO UPDATE SET "
    "first_seen_ns = CASE WHEN excluded.first_seen_ns < process.first_seen_ns "
    "THEN excluded.first_seen_ns ELSE process.first_seen_ns END, "
    f"{_largest('last_seen_ns')}, "
    "service_name = COALESCE(excluded.service_name, process.service_name), "
    "engine_id = COALESCE(excluded.engine_id, process.engine_id), "
    "kv_role = COALESCE(excluded.kv_role, process.kv_role), "
    f"{_largest('telemetry_emitted')}, {_largest('telemetry_dropped')}, "
    "resource = CASE WHEN excluded.resource != '{}' THEN excluded.resource "
    "ELSE process.resource END"
)


def write_rows(connection: Connection, facts: Facts, resources: dict, now_ns: int) -> int:
    """Writes one batch's rows in the caller's transaction; returns the spans new to the
    database (an exporter's retry of a stored batch adds none)."""
    writer = BulkCursor(connection, STAGED_TABLES)
    # Two backends' writes of one request take turns (request_locks): its numbering, and the
    # rollups (triggers, and kv_waits for points) that read its other rows.
    pairs = set(_numbered_pairs(facts))
    request_locks.lock(writer, pairs)
    numbers = request_numbers.assign(writer, pairs)
    spans = request_numbers.numbered(facts.spans, _SPAN_ENGINE, _SPAN_REQUEST, numbers)
    new_spans = writer.insert(table_of(Span), _NUMBERED_SPAN_COLUMNS, spans)
    times = [(row[_START], row[_RECEIVED]) for row in facts.spans]
    span_counts.add_stored(writer, times, new_spans)
    for rows in (facts.transfers, facts.failures, facts.lookups):
        request_numbers.number_dicts(rows, numbers)
    for rows in (facts.request_stubs, facts.requests):  # their unique key is led by it
        request_numbers.number_dicts(rows, numbers, absent=request_numbers.NO_REQUEST)
    _insert_dicts(writer, table_of(Request), facts.request_stubs)
    if facts.requests:
        updates = ", ".join(
            f"{column} = excluded.{column}"
            for column in facts.requests[0]
            if column not in _REQUEST_KEY
        )
        upsert = _REQUEST_UPSERT.format(updates=updates)
        _insert_dicts(writer, table_of(Request), facts.requests, upsert)
    points = request_numbers.numbered(facts.points, _POINT_ENGINE, _POINT_REQUEST, numbers)
    kv_waits.insert_points(writer, table_of(TimelinePoint), _NUMBERED_POINT_COLUMNS, points)
    _insert_dicts(writer, table_of(Transfer), facts.transfers)
    _insert_dicts(writer, table_of(Failure), facts.failures)
    _insert_dicts(writer, table_of(Lookup), facts.lookups)
    _insert_dicts(writer, table_of(Latency), facts.latencies)
    _insert_dicts(writer, table_of(Lease), facts.leases, _LEASE_UPSERT)
    _insert_dicts(writer, table_of(Block), facts.blocks, _BLOCK_UPSERT)
    _upsert_processes(writer, facts, resources, now_ns)
    seqs.merge(writer, facts.seqs, now_ns)
    return new_spans


def _numbered_pairs(facts: Facts) -> Iterator[request_numbers.Pair]:
    """(engine or '', request id) of each row that carries its request's number."""
    for row in facts.spans:
        if row[_SPAN_REQUEST] is not None:
            yield row[_SPAN_ENGINE] or "", row[_SPAN_REQUEST]
    for point in facts.points:
        if point[_POINT_REQUEST] is not None:
            yield point[_POINT_ENGINE] or "", point[_POINT_REQUEST]
    for rows in (
        facts.request_stubs,
        facts.requests,
        facts.transfers,
        facts.failures,
        facts.lookups,
    ):
        for fields in rows:
            if fields["request_id"] is not None:
                yield fields["engine_id"] or "", fields["request_id"]


def _insert_dicts(
    writer: BulkCursor, table, rows: list[dict], on_conflict: str = DO_NOTHING
) -> None:
    """Rows built as dicts by one builder, so every row has the same keys in one order."""
    if rows:
        writer.insert(table, list(rows[0]), [tuple(row.values()) for row in rows], on_conflict)


def _upsert_processes(writer: BulkCursor, facts: Facts, resources: dict, now_ns: int) -> None:
    origins = set(facts.origins) | set(resources) | set(facts.telemetry)
    rows = []
    for origin in sorted(origins):
        resource = resources.get(origin, {})
        _, emitted, dropped = facts.telemetry.get(origin, (None, None, None))
        service_name, engine_id, kv_role = facts.origins.get(origin, (None, None, None))
        rows.append(
            {
                "instance_id": origin,
                "service_name": service_name or _str(resource.get(SERVICE_NAME)),
                "engine_id": engine_id or _str(resource.get(names.ENGINE_ID)),
                "kv_role": kv_role,
                "first_seen_ns": now_ns,
                "last_seen_ns": now_ns,
                "telemetry_emitted": _counter(emitted),
                "telemetry_dropped": _counter(dropped),
                "resource": json.dumps(resource, default=str),
            }
        )
    _insert_dicts(writer, table_of(Process), rows, _PROCESS_UPSERT)


def _counter(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value) -> str | None:
    return None if value is None else clean(str(value))
