"""`kvscope dashboard`: a stop signal stops the streamlit server it started, leaving nothing."""

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil

from kvscope.harness.engine import free_port


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read()
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"no answer from {url} within {timeout_s} s")


def test_sigterm_leaves_no_streamlit_behind(tmp_path):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "kvscope.cli.main", "dashboard", "--port", str(port)]
        + ["--backend", "http://127.0.0.1:9"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "HOME": str(tmp_path)},
        start_new_session=True,
    )
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/_stcore/health", process)
        tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
        process.send_signal(signal.SIGTERM)  # as `docker stop` or systemd would
        process.wait(timeout=30)
        _, alive = psutil.wait_procs(tree, timeout=10)
        assert not alive, [p.cmdline() for p in alive]
    finally:  # whatever is left of its process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
