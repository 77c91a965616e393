"""Which UCX transports a NIXL read really used, from UCX's own protocol selection tables.

NIXL's Python API names the backend of a transfer (UCX) but not UCX's lanes, and the UCX
endpoints are hidden inside NIXL. UCX prints the protocol it selected for every operation of
every endpoint configuration when UCX_PROTO_INFO=y; with UCX_LOG_FILE that goes to a file we
read. Both are read by UCX when it loads, so they are set before the process's first agent;
where that is too late (UCX already loaded, the user turned it off) every answer is 'unknown'.
Nothing here raises: telemetry never breaks a read.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from kvscope.connector.p2p.transport.ucx_tables import (
    TableParser,
    is_active_message,
    is_read_into,
    ucx_memory,
)

logger = logging.getLogger(__name__)

OFF_ENV: Final = "KVSCOPE_P2P_UCX_LANES"
"""Set to 0 to leave UCX's logging alone (every read's UCX lanes are then 'unknown')."""
UNKNOWN: Final = "unknown"
MAX_LOG_BYTES: Final = 8 << 20
"""Past this much UCX log the reader stops reading (lanes learned so far are kept)."""
_WORKER_NAME_CHARS = 31  # UCP_WORKER_NAME_MAX less its NUL: UCX cuts NIXL's agent name


@dataclass(frozen=True)
class ReadLanes:
    """What UCX chose for reads between two memories of one kind, on this agent's endpoints."""

    scope: str  # 'intra-node' (peer on this host), 'inter-node', several joined, or 'unknown'
    data: tuple[str, ...]  # transport/device of the read's bytes, e.g. ('cma/memory',)
    control: tuple[str, ...]  # of NIXL's notifications (UCX active messages), e.g. ('tcp/lo',)


UNKNOWN_LANES: Final = ReadLanes(UNKNOWN, (), ())


def _ucx_loaded() -> bool:
    try:
        return "libucs" in Path("/proc/self/maps").read_text()
    except OSError:
        return True  # cannot tell: assume too late, so nothing is printed to stdout instead


class _UcxLog:
    """UCX's log file of this process and what has been parsed of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.parser = TableParser()
        self._offset = 0
        self._lock = threading.Lock()
        self._libc = ctypes.CDLL(None)

    def refresh(self) -> None:
        """Parse what UCX wrote since the last call (it buffers: flush C's streams first)."""
        with self._lock:
            self._libc.fflush(None)
            size = self.path.stat().st_size
            if size <= self._offset or self._offset >= MAX_LOG_BYTES:
                return
            with self.path.open("rb") as log:
                log.seek(self._offset)
                chunk = log.read(min(size, MAX_LOG_BYTES) - self._offset)
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a half-written line waits
            self._offset += len(complete)
            for line in complete.decode(errors="replace").splitlines():
                self.parser.feed(line)
            self.parser.feed("")  # a table at the end is complete once its last row is in
            for message in self.parser.other:
                if "WARN" in message or "ERROR" in message:
                    logger.warning("UCX: %s", message)
            self.parser.other.clear()


_log: _UcxLog | None = None
_setup_lock = threading.Lock()


def prepare_before_agent() -> None:
    """Ask UCX for its protocol tables in a log file; call before creating a NIXL agent."""
    global _log
    with _setup_lock:
        if _log is not None or os.environ.get(OFF_ENV, "1") == "0":
            return
        if os.environ.get("UCX_PROTO_INFO", "y").lower() not in ("y", "yes", "1", "on"):
            return
        try:
            if "UCX_LOG_FILE" in os.environ:  # the user's file: read it as it is
                path = Path(os.environ["UCX_LOG_FILE"].replace("%p", str(os.getpid())))
            elif _ucx_loaded():
                return
            else:
                folder = Path(tempfile.gettempdir()) / "kvscope-ucx"
                folder.mkdir(exist_ok=True)
                path = folder / f"{os.getpid()}.log"
                os.environ["UCX_LOG_FILE"] = str(path)
                atexit.register(_remove, path)
            os.environ["UCX_PROTO_INFO"] = "y"
            _log = _UcxLog(path)
            logger.info("p2p: UCX logs to %s (its protocol tables name each read's lanes)", path)
        except Exception as exc:
            logger.info("p2p: UCX lanes will be unknown: %s", exc)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def forward_warnings() -> bool:
    """Read what UCX logged since the last call (its warnings go to our log); False if the
    log cannot be read."""
    if _log is None:
        return False
    try:
        _log.refresh()
        return True
    except Exception as exc:
        logger.debug("p2p: could not read UCX's log: %s", exc)
        return False


def read_lanes(agent_name: str, nixl_memory_kind: str) -> ReadLanes:
    """The lanes UCX selected so far for this agent's reads (call once a read completed)."""
    if _log is None or not forward_warnings():
        return UNKNOWN_LANES
    try:
        worker = agent_name[:_WORKER_NAME_CHARS]
        tables = [t for t in _log.parser.tables if t.worker == worker and t.scope != "self"]
    except Exception as exc:
        logger.debug("p2p: could not read UCX's tables: %s", exc)
        return UNKNOWN_LANES
    memory = ucx_memory(nixl_memory_kind)
    reads = [t for t in tables if is_read_into(t, memory)]
    if not reads:
        return UNKNOWN_LANES
    scopes = sorted({t.scope for t in reads})
    return ReadLanes(
        "+".join(scopes),
        _union(t.lanes for t in reads),
        _union(t.lanes for t in tables if is_active_message(t) and t.scope in scopes),
    )


def _union(lane_lists) -> tuple[str, ...]:
    seen: list[str] = []
    for lanes in lane_lists:
        seen.extend(lane for lane in lanes if lane not in seen)
    return tuple(seen)
