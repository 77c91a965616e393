"""Which kvscope.seq numbers arrived from each process, and the holes between them."""

from dataclasses import dataclass

from sqlalchemy import Connection, select

from kvscope.backend.db.bulk import BulkCursor
from kvscope.backend.db.models import SeqRange
from kvscope.backend.db.models.columns import table_of

FIRST_SEQ = 0
"""traces.sdk numbers spans from 0 (itertools.count()); a range starting later has a head hole."""


_RUN_COLUMNS = "lo, hi, lo_start_ns, hi_start_ns, seen_ns"
# Two backends on one PostgreSQL: each merge reads a process's ranges, then replaces them, so
# two merges of one process must take turns (a transaction-scoped lock per process, taken in
# sorted order so that two batches cannot wait for each other). SQLite has a single writer.
_LOCK_PROCESS = "SELECT pg_advisory_xact_lock(?, hashtext(?))"
_SEQ_LOCKS = 0x6B7673  # the lock space's first key, beside migrations' MIGRATION_LOCK
_ORIGINS_PER_QUERY = 500  # well under SQLite's limit on parameters per statement


@dataclass(slots=True)
class Run:
    lo: int
    hi: int
    lo_start_ns: int
    hi_start_ns: int
    seen_ns: int


@dataclass(slots=True)
class Hole:
    """Seq numbers not received between two runs; age counts from when the later run arrived."""

    origin: str
    first: int
    last: int
    after_ns: int | None
    before_ns: int
    age_s: float
    state: str

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def runs_of(items: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """Consecutive runs (lo, hi, lo_start_ns, hi_start_ns) of one batch's (seq, start_ns) pairs:
    made where the batch is derived, so the writer gets a handful, not a pair a span."""
    pairs = sorted(set(items))
    if not pairs:
        return []
    runs: list[tuple[int, int, int, int]] = []
    lo, lo_start_ns = hi, hi_start_ns = pairs[0]
    for seq, start_ns in pairs:
        if seq > hi + 1:
            runs.append((lo, hi, lo_start_ns, hi_start_ns))
            lo, lo_start_ns = seq, start_ns
        if seq > hi:  # not a seq already seen (sent twice, with another start)
            hi, hi_start_ns = seq, start_ns
    runs.append((lo, hi, lo_start_ns, hi_start_ns))
    return runs


def merged(runs: list[Run]) -> list[Run]:
    """Runs joined where they touch or overlap; a hole's age keeps its first sighting."""
    out: list[Run] = []
    for run in sorted(runs, key=lambda r: (r.lo, r.hi)):
        last = out[-1] if out else None
        if last is not None and run.lo <= last.hi + 1:
            if run.hi > last.hi:
                last.hi, last.hi_start_ns = run.hi, run.hi_start_ns
            last.seen_ns = min(last.seen_ns, run.seen_ns)
        else:
            out.append(Run(run.lo, run.hi, run.lo_start_ns, run.hi_start_ns, run.seen_ns))
    return out


def merge(
    writer: BulkCursor, seqs: dict[str, list[tuple[int, int, int, int]]], now_ns: int
) -> None:
    """Folds one batch's runs of seq numbers (runs_of) into the stored ranges of each process;
    now_ns: when they were seen."""
    if not seqs:
        return
    origins = sorted(seqs)
    if writer.postgres:
        for origin in origins:
            writer.execute(_LOCK_PROCESS, (_SEQ_LOCKS, origin))
    stored: dict[str, list[Run]] = {origin: [] for origin in origins}
    for start in range(0, len(origins), _ORIGINS_PER_QUERY):
        chunk = origins[start : start + _ORIGINS_PER_QUERY]
        found = writer.execute(
            f"SELECT instance_id, {_RUN_COLUMNS} FROM seqrange "
            f"WHERE instance_id IN ({', '.join('?' * len(chunk))})",
            chunk,
        )
        for instance_id, *run in found:
            stored[instance_id].append(Run(*run))
    for origin, runs in seqs.items():
        old = stored[origin]
        new = merged(old + [Run(*run, now_ns) for run in runs])
        if [(r.lo, r.hi) for r in new] == sorted((r.lo, r.hi) for r in old):
            continue
        if old:
            writer.execute("DELETE FROM seqrange WHERE instance_id = ?", (origin,))
        writer.executemany(
            f"INSERT INTO seqrange (instance_id, {_RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            [(origin, r.lo, r.hi, r.lo_start_ns, r.hi_start_ns, r.seen_ns) for r in new],
        )


def holes(
    connection: Connection, now_ns: int, grace_s: float, origin: str | None = None
) -> list[Hole]:
    """Every hole of every process (or one); 'pending' while younger than the grace period."""
    table = table_of(SeqRange)
    query = select(table).order_by(table.c.instance_id, table.c.lo)
    if origin is not None:
        query = query.where(table.c.instance_id == origin)
    found: list[Hole] = []
    previous = None
    for row in connection.execute(query):
        if previous is None or previous.instance_id != row.instance_id:
            first, after_ns = FIRST_SEQ, None
        else:
            first, after_ns = previous.hi + 1, previous.hi_start_ns
        if row.lo > first:
            age_s = max(0.0, (now_ns - row.seen_ns) / 1e9)
            found.append(
                Hole(
                    row.instance_id,
                    first,
                    row.lo - 1,
                    after_ns,
                    row.lo_start_ns,
                    age_s,
                    "pending" if age_s < grace_s else "missing",
                )
            )
        previous = row
    return found


def received_counts(connection: Connection) -> dict[str, tuple[int, int]]:
    """Per process: spans received (distinct seq numbers) and the highest seq seen."""
    table = table_of(SeqRange)
    counts: dict[str, tuple[int, int]] = {}
    for row in connection.execute(select(table.c.instance_id, table.c.lo, table.c.hi)):
        received, highest = counts.get(row.instance_id, (0, -1))
        counts[row.instance_id] = (received + row.hi - row.lo + 1, max(highest, row.hi))
    return counts
