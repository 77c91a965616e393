"""Parse UCX's protocol selection tables (UCX_PROTO_INFO=y) into the lanes each endpoint uses."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# "[1796657081.45] [host:8585 :0]   | 0..inf | zero-copy | cma/memory |" -> the table part.
_PREFIX = re.compile(r"^\[[^\]]*\]\s+\[[^\]]*\]\s+")
# A transport and its device in a Config cell: "cma/memory", "tcp/lo", "rc_mlx5/mlx5_0:1".
_LANE = re.compile(r"\b([a-z][a-z0-9_]*)/([A-Za-z0-9_.:\-]+)")
# A table's first title row: "<worker name> <endpoint scope> cfg#<n>".
_TITLE = re.compile(r"^(?P<worker>\S+) (?P<scope>.+?) cfg#(?P<cfg>\d+)$")


@dataclass(frozen=True)
class ProtoTable:
    """One operation's protocol choices on one endpoint configuration of one UCX worker."""

    worker: str  # UCX's worker name: NIXL's agent name, cut to 31 characters
    scope: str  # 'self', 'intra-node' (the peer is on this host) or 'inter-node'
    cfg: int
    operation: str  # e.g. 'remote memory read by ucp_get*(multi) into host memory from host'
    lanes: tuple[str, ...]  # transport/device in order of first use, e.g. ('cma/memory',)


@dataclass
class TableParser:
    """Fed UCX log lines one at a time; collects every complete protocol table it sees.

    Lines that are not part of a table are kept in `other` (UCX's own warnings, which the
    log file took away from stdout)."""

    tables: list[ProtoTable] = field(default_factory=list)
    other: list[str] = field(default_factory=list)
    _titles: list[str] = field(default_factory=list)
    _lanes: list[str] = field(default_factory=list)
    _in_rows: bool = False

    def feed(self, line: str) -> None:
        body = _PREFIX.sub("", line.rstrip("\n")).strip()
        if not body.startswith(("|", "+")):
            self._close()
            if body:
                self.other.append(body)
            return
        if body.startswith("+"):
            return
        cells = [cell.strip() for cell in body.strip("|").split("|")]
        if len(cells) == 1:
            if self._in_rows:  # a new table's title right after the last one's rows
                self._close()
            self._titles.append(cells[0])
        elif cells[0] == "Range":
            self._in_rows = True
        elif self._in_rows:
            for tl, device in _LANE.findall(cells[-1]):
                if f"{tl}/{device}" not in self._lanes:
                    self._lanes.append(f"{tl}/{device}")

    def _close(self) -> None:
        if self._in_rows and len(self._titles) >= 2:
            title = _TITLE.match(self._titles[0])
            if title is not None:
                self.tables.append(
                    ProtoTable(
                        title["worker"],
                        title["scope"],
                        int(title["cfg"]),
                        " ".join(self._titles[1:]),
                        tuple(self._lanes),
                    )
                )
        self._titles, self._lanes, self._in_rows = [], [], False


def ucx_memory(nixl_memory_kind: str) -> str:
    """UCX's name in its tables for NIXL's memory kind: 'host' for DRAM, 'cuda' for VRAM."""
    return {"DRAM": "host", "VRAM": "cuda"}.get(nixl_memory_kind, nixl_memory_kind.lower())


def is_read_into(table: ProtoTable, memory: str) -> bool:
    """A remote-read (get) table between two memories of this kind ('host', 'cuda')."""
    return table.operation.startswith("remote memory read") and table.operation.endswith(
        f"into {memory} memory from {memory}"
    )


def is_active_message(table: ProtoTable) -> bool:
    """The table of UCX active messages: the lanes NIXL's notifications go over."""
    return table.operation.startswith("active message by ucp_am_send*")
