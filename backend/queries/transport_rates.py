"""Expected and line rates of each UCX transport, and the flags a P2P read's rate raises.

The defaults are typical figures, in GB/s (1e9 bytes/s), for one lane: `expected` is what a
healthy large read reaches, `line` the most the path can carry (a read faster than that was
measured over the wrong window). Override any with KVSCOPE_BACKEND_TRANSPORT_RATES, a JSON
object {"family": [expected, line], ...} (families as in TRANSPORT_FAMILIES' values).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

DEFAULT_RATES_GBPS: Final[dict[str, tuple[float, float]]] = {
    "self": (10.0, 200.0),  # a copy within one process
    "cma": (8.0, 100.0),  # process_vm_readv: one memory copy between processes of one host
    "shm": (8.0, 100.0),  # sysv/posix/xpmem/knem shared memory: a memory copy
    "tcp": (1.0, 25.0),  # loopback or Ethernet through the kernel (line: 200 GbE)
    "rc": (20.0, 50.0),  # InfiniBand/RoCE reliable connection verbs, per rail (line: 400 Gb/s)
    "dc": (20.0, 50.0),  # dynamically connected verbs, per rail
    "ud": (5.0, 50.0),  # unreliable datagram verbs
    "cuda_ipc": (150.0, 450.0),  # GPU to GPU over NVLink (line: H100 NVLink, one direction)
    "cuda_copy": (20.0, 64.0),  # staged through host memory over PCIe (line: PCIe 5 x16)
    "gdr_copy": (10.0, 64.0),  # GPUDirect RDMA copy over PCIe
}
"""Each transport family's (expected, line) rate in GB/s."""

TRANSPORT_FAMILIES: Final = {
    "self": "self",
    "cma": "cma",
    "sysv": "shm",
    "posix": "shm",
    "xpmem": "shm",
    "knem": "shm",
    "tcp": "tcp",
    "rc": "rc",
    "rc_verbs": "rc",
    "rc_mlx5": "rc",
    "dc": "dc",
    "dc_mlx5": "dc",
    "ud": "ud",
    "ud_verbs": "ud",
    "ud_mlx5": "ud",
    "cuda_ipc": "cuda_ipc",
    "cuda_copy": "cuda_copy",
    "gdr_copy": "gdr_copy",
}
"""UCX transport name (the part before '/' of 'cma/memory') -> family of DEFAULT_RATES_GBPS."""

SLOW_GBPS: Final = 1.0
"""Dynamo's red flag: a KV transfer under 1 GB/s."""
SLOW_MIN_BYTES: Final = 1 << 20
"""Reads smaller than this are latency-bound: their GB/s is not judged against SLOW_GBPS."""
LINE_TOLERANCE: Final = 1.1
"""A read above line rate x this was timed over another window than its bytes."""

TCP_STAGED: Final = "tcp_staged"
UNDER_1_GBPS: Final = "under_1gbps"
ABOVE_LINE_RATE: Final = "above_line_rate"
_FAST_LOCAL = {"self", "cma", "shm", "cuda_ipc"}


def rates_from(setting: str) -> dict[str, tuple[float, float]]:
    """The defaults with the setting's JSON overrides; raises ValueError naming a bad entry."""
    rates = dict(DEFAULT_RATES_GBPS)
    if not setting.strip():
        return rates
    for family, pair in json.loads(setting).items():
        if not (isinstance(pair, list) and len(pair) == 2 and all(v > 0 for v in pair)):
            raise ValueError(f"transport rate {family!r}: expected [expected, line] in GB/s")
        rates[family] = (float(pair[0]), float(pair[1]))
    return rates


def family_of(lane: str) -> str:
    """'cma/memory' -> 'cma', 'rc_mlx5/mlx5_0:1' -> 'rc'; 'unknown' for a transport not listed."""
    return TRANSPORT_FAMILIES.get(lane.split("/", 1)[0], "unknown")


@dataclass(frozen=True)
class PathRate:
    """A read's path judged: its families, expected and line rate, and its flags."""

    families: list[str]
    expected_gbps: float | None
    line_gbps: float | None
    flags: list[str]


def judge(
    lanes: list[str],
    scope: str,
    memory: str,
    num_bytes: int,
    gbps: float,
    rates: dict[str, tuple[float, float]] = DEFAULT_RATES_GBPS,
) -> PathRate:
    """Expected and line rate of the lanes (rails add up) and the flags the read raises."""
    families = sorted({family_of(lane) for lane in lanes})
    known = [rates[family_of(lane)] for lane in lanes if family_of(lane) in rates]
    expected = sum(e for e, _ in known) if known else None
    line = sum(line for _, line in known) if known else None
    flags = []
    local_lane_expected = scope == "intra-node" or memory == "VRAM"
    if "tcp" in families and not _FAST_LOCAL & set(families) and local_lane_expected:
        flags.append(TCP_STAGED)
    if num_bytes >= SLOW_MIN_BYTES and 0 < gbps < SLOW_GBPS:
        flags.append(UNDER_1_GBPS)
    if line is not None and gbps > line * LINE_TOLERANCE:
        flags.append(ABOVE_LINE_RATE)
    return PathRate(families, expected, line, flags)
