"""`kvscope backend` in a subprocess that a test can stop, pause and bring back on the same port."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from kvscope.harness.engine import free_port


class BackendProcess:
    """The real backend with a SQLite file; the file and port survive a restart."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.restarts = 0

    @property
    def started(self) -> subprocess.Popen:
        """The process start() started."""
        if self.process is None:
            raise RuntimeError("the backend process was not started: call start()")
        return self.process

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def traces_url(self) -> str:
        return self.url + "/v1/traces"

    def start(self) -> "BackendProcess":
        env = {**os.environ, "DATABASE_URL": f"sqlite:///{self.workdir / 'kvscope.db'}"}
        cmd = [sys.executable, "-m", "kvscope.cli.main", "backend", "--port", str(self.port)]
        with open(self.workdir / f"backend-{self.restarts}.log", "wb") as log:
            self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout_s: float = 90) -> "BackendProcess":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.started.poll() is not None:
                break
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.2)
        log = (self.workdir / f"backend-{self.restarts}.log").read_text()[-2000:]
        raise TimeoutError(f"backend not healthy after {timeout_s} s:\n{log}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.resume()
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start().wait_ready()

    def pause(self) -> None:
        """SIGSTOP: alive, port open, answers nothing (a backend that cannot keep up)."""
        os.kill(self.started.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.started.pid, signal.SIGCONT)

    def get(self, path: str, **params) -> Any:  # the JSON answer, as httpx parses it
        response = httpx.get(self.url + path, params=params, timeout=20)
        response.raise_for_status()
        return response.json()

    def failures(self, since_ns: int, until_ns: int, req_prefix: str) -> list[dict]:
        """Failure rows of one cell: in its time window, of its requests or of no request."""
        rows = self.get("/api/v1/failures", since_ns=since_ns, until_ns=until_ns, limit=500)
        mine = lambda row: row["request_id"] is None or row["request_id"].startswith(req_prefix)  # noqa: E731
        return [row for row in rows["items"] if mine(row)]

    def requests(self, req_prefix: str, since_ns: int) -> list[dict]:
        """Request rows of one cell: started in its window, of its requests."""
        rows = self.get("/api/v1/requests", since_ns=since_ns, limit=500)["items"]
        return [row for row in rows if (row["request_id"] or "").startswith(req_prefix)]

    def active_leases(self) -> list[dict]:
        return self.get("/api/v1/leases", active=True, limit=500)["items"]

    def stream(self, origin: str) -> dict | None:
        return next((s for s in self.get("/api/v1/streams") if s["origin"] == origin), None)
