"""Per-second rollups of the overview's series, kept by database triggers as rows arrive.

The triggers fire only for rows really inserted (an exporter's retry, skipped by ON
CONFLICT DO NOTHING, adds nothing) and run in the batch's own transaction, so the rollups
are exactly as committed as the rows. Those that read a request's other rows need the writer
to lock the request first (request_locks): another backend's uncommitted rows are unseen.
Each row of series_rollup is one (metric, second, engine, label) with four counters:

- hit: the composite's (or a plain connector's) lookups, each request's last decided one per
  connector: samples = lookups, positives = lookups with a hit, total = hit tokens, extra =
  the request's prompt tokens (added when the request row brings them, before or after).
- bytes: transfers by direction (label): samples = transfers, total = bytes.
- ttft, kv_wait: histograms, label = the bin of the value in ms (two significant digits,
  see bin_bounds_ms), samples = values in the bin. KV waits are counted by the writer, a
  batch at a time, not by a trigger (kv_waits).
"""

from sqlalchemy import Connection, event
from sqlmodel import SQLModel

from kvscope.backend.db import read_schema

RESOLUTION_NS = 1_000_000_000
"""A rollup row covers one second: series steps are whole seconds, aligned to them."""

_COLUMNS = "metric, bucket_ns, engine_id, label, samples, positives, total, extra"
_UPSERT = (
    "ON CONFLICT (metric, bucket_ns, engine_id, label) DO UPDATE SET "
    "samples = series_rollup.samples + excluded.samples, "
    "positives = series_rollup.positives + excluded.positives, "
    "total = series_rollup.total + excluded.total, "
    "extra = series_rollup.extra + excluded.extra"
)
_R = RESOLUTION_NS


def add_sql(rows: str) -> str:
    """Adds rows (a SELECT, or VALUES, of the eight columns in order) to the counters they name."""
    return f"INSERT INTO series_rollup ({_COLUMNS}) {rows} {_UPSERT}"


def bin_sql(value: str, postgres: bool) -> str:
    """The histogram bin of a value in ms, as SQL: (decade + 3) * 100 + its first two digits."""
    floor = "CAST(FLOOR({}) AS INTEGER)" if postgres else "CAST({} AS INTEGER)"
    cases = [f"WHEN {value} < 0.001 THEN 0"]
    for decade in range(-3, 7):
        digits = floor.format(f"({value}) * 1e{1 - decade}")
        cases.append(f"WHEN {value} < 1e{decade + 1} THEN {(decade + 3) * 100} + {digits}")
    return f"(CASE {' '.join(cases)} ELSE 1000 END)"


def bin_bounds_ms(label: str) -> tuple[float, float]:
    """[low, high) in ms of a bin; at most 10% wide (1% for values starting with 9)."""
    number = int(label)
    if number == 0:
        return 0.0, 0.001
    if number >= 1000:
        return 1e7, 1e7
    decade, digits = number // 100 - 3, number % 100
    return digits / 10 * 10.0**decade, (digits + 1) / 10 * 10.0**decade


def _by(index: str, postgres: bool) -> str:
    """SQLite without statistics may pick a time index for a per-request probe: name it."""
    return "" if postgres else f"INDEXED BY {index}"


def _is(postgres: bool) -> str:
    return "IS NOT DISTINCT FROM" if postgres else "IS"


def _prompt(alias: str) -> str:
    return (
        "COALESCE((SELECT MAX(r.prompt_tokens) FROM kv_request r "
        f"WHERE r.request_no = {alias}.request_no), 0)"
    )


def _same_key(other: str, of: str, postgres: bool) -> str:
    """The same request (its number: backend/db/request_numbers.py) and connector."""
    return (
        f"{other}.request_no = {of}.request_no AND {other}.connector {_is(postgres)} "
        f"{of}.connector AND {other}.child IS NULL AND {other}.id != {of}.id"
    )


def _later(other: str, than: str) -> str:
    return (
        f"({other}.time_ns > {than}.time_ns OR "
        f"({other}.time_ns = {than}.time_ns AND {other}.id > {than}.id))"
    )


def _hit_row(alias: str, sign: str) -> str:
    return (
        f"SELECT 'hit', {alias}.time_ns - {alias}.time_ns % {_R}, "
        f"COALESCE({alias}.engine_id, ''), '', {sign}1, "
        f"{sign}(CASE WHEN {alias}.hit_tokens > 0 THEN 1 ELSE 0 END), "
        f"{sign}{alias}.hit_tokens, {sign}{_prompt(alias)}"
    )


def lookup_statements(postgres: bool) -> list[str]:
    """A new lookup replaces its request's earlier last one, unless a later one is counted."""
    previous = (
        f"SELECT o.id FROM lookup o {_by('ix_lookup_request_no', postgres)} "
        f"WHERE {_same_key('o', 'NEW', postgres)} "
        "ORDER BY o.time_ns DESC, o.id DESC LIMIT 1"
    )
    retire = add_sql(
        f"{_hit_row('p', '-')} FROM lookup p WHERE NEW.request_id IS NOT NULL "
        f"AND p.id = ({previous}) AND {_later('NEW', 'p')}"
    )
    count = add_sql(
        f"{_hit_row('NEW', '')} WHERE NEW.request_id IS NULL OR NOT EXISTS "
        f"(SELECT 1 FROM lookup o {_by('ix_lookup_request_no', postgres)} "
        f"WHERE {_same_key('o', 'NEW', postgres)} "
        f"AND {_later('o', 'NEW')})"
    )
    return [retire, count]


def prompt_statements(postgres: bool) -> list[str]:
    """A request's prompt length, first known: added to its counted lookups."""
    counted = add_sql(
        f"SELECT 'hit', l.time_ns - l.time_ns % {_R}, COALESCE(l.engine_id, ''), '', "
        "0, 0, 0, NEW.prompt_tokens FROM lookup l "
        f"{_by('ix_lookup_request_no', postgres)} WHERE l.request_no = NEW.request_no "
        "AND l.child IS NULL AND NOT EXISTS "
        f"(SELECT 1 FROM lookup o {_by('ix_lookup_request_no', postgres)} "
        f"WHERE {_same_key('o', 'l', postgres)} AND {_later('o', 'l')}) "
        "AND NOT EXISTS (SELECT 1 FROM kv_request q WHERE q.request_no = NEW.request_no "
        "AND q.id != NEW.id AND q.prompt_tokens IS NOT NULL)"
    )
    return [counted]


def transfer_statements(postgres: bool) -> list[str]:
    return [
        add_sql(
            f"SELECT 'bytes', NEW.start_ns - NEW.start_ns % {_R}, COALESCE(NEW.engine_id, ''), "
            "COALESCE(NEW.direction, ''), 1, 0, COALESCE(NEW.bytes, 0), 0"
            + (" WHERE true" if not postgres else "")
        )
    ]


def latency_statements(postgres: bool) -> list[str]:
    return [
        add_sql(
            f"SELECT 'ttft', NEW.time_ns - NEW.time_ns % {_R}, '', "
            f"CAST({bin_sql('NEW.ttft_ms', postgres)} AS TEXT), 1, 0, 0, 0"
            + (" WHERE true" if not postgres else "")
        )
    ]


# (trigger, table, event, condition on NEW (and OLD), statements)
TRIGGERS = (
    ("kvscope_rollup_lookup", "lookup", "INSERT", "NEW.child IS NULL", lookup_statements),
    (
        "kvscope_rollup_prompt_new",
        "kv_request",
        "INSERT",
        "NEW.prompt_tokens IS NOT NULL",
        prompt_statements,
    ),
    (
        "kvscope_rollup_prompt_set",
        "kv_request",
        "UPDATE",
        "NEW.prompt_tokens IS NOT NULL AND OLD.prompt_tokens IS NULL",
        prompt_statements,
    ),
    ("kvscope_rollup_bytes", "transfer", "INSERT", "true", transfer_statements),
    ("kvscope_rollup_ttft", "latency", "INSERT", "NEW.ttft_ms IS NOT NULL", latency_statements),
)


def install(connection: Connection) -> None:
    """Creates (or replaces) every rollup trigger; idempotent."""
    postgres = connection.dialect.name == "postgresql"
    cursor = connection.connection.cursor()  # no parameters: '%' is SQL's modulo here
    for name, table, on, condition, statements in TRIGGERS:
        body = ";\n".join(statements(postgres))
        if postgres:
            for sql in _postgres_trigger(name, table, on, condition, body):
                cursor.execute(sql)
        else:
            cursor.execute(f"DROP TRIGGER IF EXISTS {name}")
            cursor.execute(
                f"CREATE TRIGGER {name} AFTER {on} ON {table} FOR EACH ROW "
                f"WHEN {condition} BEGIN {body}; END"
            )


def _postgres_trigger(name: str, table: str, on: str, condition: str, body: str) -> list[str]:
    function = (
        f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $body$ "
        f"BEGIN {body}; RETURN NULL; END $body$"
    )
    return [
        function,
        f"DROP TRIGGER IF EXISTS {name} ON {table}",
        f"CREATE TRIGGER {name} AFTER {on} ON {table} FOR EACH ROW "
        f"WHEN ({condition}) EXECUTE FUNCTION {name}()",
    ]


@event.listens_for(SQLModel.metadata, "after_create")
def _install_after_create(_metadata, connection: Connection, **_kw) -> None:
    if connection.dialect.has_table(connection, "series_rollup"):
        install(connection)


def migrate(connection: Connection) -> None:
    """Migration 6: the rollup table, the lookup index and the triggers (rows stored before
    the upgrade are not rolled up: the series start with it)."""
    read_schema.add_missing(connection)
    install(connection)
