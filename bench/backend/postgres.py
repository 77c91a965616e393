"""PostgreSQL for the benches: a throwaway server or database, what it stores, what it costs."""

import re
import subprocess
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from kvscope.backend.db.database import normalized_url
from kvscope.backend.db.models import Span
from kvscope.bench.pd.pd_pair import pid_cpu_seconds

DURABILITY = ("fsync", "synchronous_commit")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "postgres.sh"


@contextmanager
def fresh_database(server_url: str, name: str):
    """A database of its own on the server (made as the backend tests' throwaway ones are),
    dropped afterwards; yields its URL."""
    admin = create_engine(normalized_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            url = make_url(normalized_url(server_url)).set(database=name)
            yield url.render_as_string(hide_password=False)
        finally:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def spans_in(database_url: str) -> int:
    engine = create_engine(normalized_url(database_url))
    try:
        with engine.connect() as connection:
            return connection.execute(select(func.count()).select_from(Span.__table__)).scalar()
    finally:
        engine.dispose()


def durability(server_url: str) -> str:
    """What a commit waits for on the server (the throwaway one waits for no disk)."""
    engine = create_engine(normalized_url(server_url))
    try:
        with engine.connect() as connection:
            found = [connection.execute(text(f"SHOW {n}")).scalar() for n in DURABILITY]
        return ", ".join(f"{name} {value}" for name, value in zip(DURABILITY, found, strict=True))
    finally:
        engine.dispose()


def postmaster(server_url: str) -> psutil.Process | None:
    """The server's main process when it runs on this machine: the parent of this connection's
    server process, checked against the server's data directory (its working directory)."""
    engine = create_engine(normalized_url(server_url))
    try:
        with engine.connect() as connection:
            pid = connection.execute(text("SELECT pg_backend_pid()")).scalar()
            data_directory = None
            with suppress(DBAPIError):  # needs pg_read_all_settings; the name check stays
                data_directory = connection.execute(text("SHOW data_directory")).scalar()
        parent = psutil.Process(pid).parent()
        if parent is None or not parent.name().startswith("postgres"):
            return None
        with suppress(psutil.AccessDenied):  # another user's server: the name check stays
            if data_directory and Path(parent.cwd()).resolve() != Path(data_directory).resolve():
                return None
        return parent
    except psutil.Error:
        return None
    finally:
        engine.dispose()


def cpu_seconds(pids: list[int], server: psutil.Process | None) -> tuple[float, float]:
    """(the backends' CPU-seconds, ingest workers included; the server's: its main process,
    its live children and those it reaped, as a connection's process exits with it)."""
    if server is None:
        return sum(map(pid_cpu_seconds, pids)), 0.0
    times = server.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in server.children(recursive=True):
        with suppress(psutil.Error):
            total += sum(child.cpu_times()[:2])
    return sum(map(pid_cpu_seconds, pids)), total


@contextmanager
def started_server():
    """A throwaway PostgreSQL from scripts/postgres.sh, stopped and deleted afterwards."""
    if not SCRIPT.exists():
        raise SystemExit("no PostgreSQL: pass --postgres URL or set KVSCOPE_BENCH_POSTGRES_URL")
    print("no --postgres given: starting a throwaway server with scripts/postgres.sh", flush=True)
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True)
    folder = re.search(r"scripts/postgres.sh stop (\S+)", done.stderr)
    try:
        if done.returncode != 0 or not done.stdout.strip():
            raise SystemExit(f"{done.stderr}\nscripts/postgres.sh failed: pass --postgres URL")
        yield done.stdout.strip().splitlines()[-1]
    finally:
        if folder:
            subprocess.run([str(SCRIPT), "stop", folder.group(1)], capture_output=True)
