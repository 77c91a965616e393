"""Fixtures: a backend fed with the real recording, the dashboard on it, headless Chromium."""

import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

from kvscope.backend.settings import Settings
from kvscope.dashboard.launch import start
from kvscope.harness.engine import free_port
from tests.backend.conftest import RunningBackend
from tests.backend.story import MS, Process, failure_story, load_story

from .replay import block_pool_spans, post_recording

CHROMIUM = os.environ.get("KVSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"


def new_backend(tmp_path: Path) -> RunningBackend:
    return RunningBackend(Settings(database_url=f"sqlite:///{tmp_path}/kvscope.db"))


def feed(backend: RunningBackend) -> None:
    """The real recording, a story with every timeline point, a failure, a big block pool."""
    post_recording(backend.url)
    scheduler = Process("kvscope-scheduler", "engine-story", "scheduler")
    worker = Process("kvscope-worker", "engine-story", "worker")
    now = time.time_ns()
    load_story(scheduler, worker, None, "story-load-1", now - 60_000 * MS)
    failure_story(scheduler, worker, "story-fail-1", now - 30_000 * MS)
    backend.export(scheduler.spans() + worker.spans())
    backend.export(block_pool_spans())


@pytest.fixture(scope="module")
def fed_backend(tmp_path_factory):
    with new_backend(tmp_path_factory.mktemp("dash-db")) as backend:
        feed(backend)
        yield backend


class Dashboard:
    """`streamlit run` of the dashboard in a child process; stopped by the fixture."""

    def __init__(self, backend_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = start("127.0.0.1", self.port, backend_url)

    def wait_ready(self, timeout_s: float = 30.0) -> "Dashboard":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dashboard exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/_stcore/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"dashboard not ready within {timeout_s} s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except Exception:
            self.process.kill()
            self.process.wait(timeout=5)


@pytest.fixture(scope="module")
def dashboard(fed_backend):
    running = Dashboard(fed_backend.url).wait_ready()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser():
    """Headless Debian Chromium through playwright (never a downloaded browser)."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed: pip install playwright"
    )
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run scripts/browser.sh (installs Debian chromium)")
    playwright = sync_api.sync_playwright().start()
    try:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=30_000
        )
        yield launched
        launched.close()
    finally:
        playwright.stop()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1800})
    opened = context.new_page()
    opened.set_default_timeout(20_000)
    yield opened
    context.close()


def screenshot(page, name: str) -> Path:
    """Saves the page under build/screenshots/ for a person to look at."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
