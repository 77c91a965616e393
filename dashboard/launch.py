"""Starts the dashboard: `streamlit run` of app.py in a child process, backend URL in its env."""

import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from kvscope.dashboard.settings import DEFAULT_BACKEND_URL

APP = Path(__file__).with_name("app.py")


def command(host: str, port: int) -> list[str]:
    """The streamlit command line: headless, no telemetry, no file watcher (saves CPU)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true",
        "--server.fileWatcherType",
        "none",
        "--browser.gatherUsageStats",
        "false",
        "--client.toolbarMode",
        "viewer",
    ]


def start(
    host: str = "127.0.0.1",
    port: int = 8501,
    backend_url: str | None = None,
    backend_token: str | None = None,
    **env: str,
) -> subprocess.Popen:
    """Starts the dashboard and returns at once; the caller stops it (terminate, wait)."""
    child_env = {**os.environ, **env}
    child_env["KVSCOPE_BACKEND_URL"] = (
        backend_url or os.environ.get("KVSCOPE_BACKEND_URL") or DEFAULT_BACKEND_URL
    )
    if backend_token is not None:
        child_env["KVSCOPE_BACKEND_TOKEN"] = backend_token
    return subprocess.Popen(command(host, port), env=child_env)


def run(host: str = "127.0.0.1", port: int = 8501, backend_url: str | None = None) -> NoReturn:
    """Becomes the dashboard (exec of streamlit): a stop signal (docker stop, systemd, a
    terminal's Ctrl-C) reaches streamlit itself, so no server outlives `kvscope dashboard`."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: the dashboard on {host} has no login: anyone who can reach it sees "
            "the backend's data with the dashboard's token",
            file=sys.stderr,
        )
    url = backend_url or os.environ.get("KVSCOPE_BACKEND_URL") or DEFAULT_BACKEND_URL
    print(f"kvscope dashboard on http://{host}:{port} reading {url}", flush=True)
    argv = command(host, port)
    os.execve(argv[0], argv, {**os.environ, "KVSCOPE_BACKEND_URL": url})
