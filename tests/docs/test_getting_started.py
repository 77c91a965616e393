"""Getting started's commands: the replay without vLLM runs here, each other block says why not."""

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvscope.harness.engine import free_port

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"
BLOCK = re.compile(r"(?P<before>(?:(?!```).)*?)```bash\n(?P<body>.*?)```", re.S)
MARKER = re.compile(r"<!-- docs-test: (?P<what>[^>]*)-->")

pytestmark = pytest.mark.timeout(300)


def blocks() -> list[tuple[str, str]]:
    """(the docs-test marker before each bash block, or '', the block's text)."""
    found = []
    for match in BLOCK.finditer(PAGE.read_text()):
        marker = MARKER.search(match["before"])
        found.append((marker["what"].strip() if marker else "", match["body"]))
    return found


def test_every_command_block_is_run_or_says_why_not():
    unmarked = [body for what, body in blocks() if not what]
    assert not unmarked, f"bash blocks without a docs-test marker: {unmarked}"


def replay_commands() -> list[list[str]]:
    (body,) = [body for what, body in blocks() if what.startswith("replay")]
    lines = [line.split("#", 1)[0].strip().rstrip("&").strip() for line in body.splitlines()]
    return [shlex.split(line) for line in lines if line]


def kvscope(argv: list[str], *extra: str) -> list[str]:
    assert argv[0].endswith("kvscope"), argv
    return [sys.executable, "-m", "kvscope.cli.main", *argv[1:], *extra]


def wait_for(url: str, process: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{process.args} exited with {process.returncode}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


def test_the_replay_without_vllm_runs_as_written(tmp_path):
    backend_cmd, replay_cmd, dashboard_cmd = replay_commands()
    assert [backend_cmd[1], replay_cmd[1], dashboard_cmd[1]] == ["backend", "replay", "dashboard"]
    backend_port, dashboard_port = free_port(), free_port()
    url = f"http://127.0.0.1:{backend_port}"
    database = f"sqlite:///{tmp_path / 'kvscope.db'}"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    flags = ("--port", str(backend_port), "--grpc-port", "0", "--database-url", database)
    backend = subprocess.Popen(kvscope(backend_cmd, *flags), **quiet)
    dashboard = None
    try:
        wait_for(f"{url}/health", backend)
        replayed = subprocess.run(
            kvscope(replay_cmd, "--backend", url), capture_output=True, text=True, timeout=240
        )
        assert replayed.returncode == 0, replayed.stderr[-2000:]
        summary = httpx.get(f"{url}/api/v1/stats/summary", params={"window_s": 600}).json()
        assert sum(summary["requests"].values()) > 20
        dashboard = subprocess.Popen(
            kvscope(dashboard_cmd, "--port", str(dashboard_port), "--backend", url), **quiet
        )
        wait_for(f"http://127.0.0.1:{dashboard_port}/_stcore/health", dashboard)
    finally:
        for process in (dashboard, backend):
            if process is not None:
                process.terminate()
                process.wait(timeout=20)
