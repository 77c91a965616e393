"""Real NIXL reads between two processes report the backend and UCX lanes UCX really chose, and
bytes and time over the read's own window; UCX_TLS changes the answer, a refusal is 'unknown'."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvscope.backend.queries.transport_rates import TCP_STAGED, family_of, judge
from kvscope.connector.p2p.transport.ucx_lanes import OFF_ENV

CHILD = Path(__file__).with_name("read_lanes_child.py")
ROOT = Path(__file__).resolve().parents[4]


def reads_under(**env: str) -> list[dict]:
    """Each read of a reader process run with these environment variables."""
    child_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        [sys.executable, str(CHILD)],
        env=child_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("LANES ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("LANES ") :])


@pytest.fixture(scope="module")
def default_reads():
    return reads_under()


def test_reads_name_nixls_backend_and_its_own_byte_count(default_reads):
    for read in default_reads:
        assert read["ok"]
        assert read["backend"] == "UCX"  # nixl_agent.query_xfer_backend
        assert read["nixl_bytes"] == read["bytes"]  # NIXL's telemetry: the same read's bytes


def test_on_one_host_ucx_reads_over_a_memory_copy_lane(default_reads):
    """Both processes on this host: UCX says the endpoint is intra-node and moves the bytes by
    a memory copy (cma here, PLATFORM.md); NIXL's notifications go over tcp/lo."""
    for read in default_reads:
        assert read["scope"] == "intra-node"
        assert read["data"] and {family_of(lane) for lane in read["data"]} <= {"cma", "shm"}
        assert "tcp/lo" in read["control"]
        path = judge(read["data"], read["scope"], "DRAM", read["bytes"], 5.0)
        assert TCP_STAGED not in path.flags


def test_tcp_only_ucx_is_seen_and_flagged_tcp_staged():
    """With UCX_TLS=tcp,self UCX can only use TCP: the lanes say so (not our config: the same
    code read cma above), and a read over TCP between two processes of one host is staged."""
    for read in reads_under(UCX_TLS="tcp,self"):
        assert read["ok"]
        assert read["data"] == ["tcp/lo"]
        assert read["scope"] == "intra-node"
        assert TCP_STAGED in judge(read["data"], read["scope"], "DRAM", read["bytes"], 1.0).flags


def test_lanes_turned_off_are_unknown_and_reads_still_work():
    for read in reads_under(**{OFF_ENV: "0"}):
        assert read["ok"] and read["backend"] == "UCX"
        assert read["scope"] == "unknown" and read["data"] == []
