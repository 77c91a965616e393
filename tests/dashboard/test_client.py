"""The backend client against a real backend: versions, reads, and the two failure states."""

import time

import pytest

from kvscope.backend.settings import Settings
from kvscope.dashboard import client, launch
from kvscope.dashboard.settings import get_settings
from tests.backend.conftest import RunningBackend
from tests.backend.story import MS, Process, load_story

from .conftest import free_port


@pytest.fixture
def point_client_at(monkeypatch):
    """Points the dashboard's settings at a URL and token; caches are cleared both ways."""

    def point(url: str, token: str | None = None) -> None:
        monkeypatch.setenv("KVSCOPE_BACKEND_URL", url)
        if token:
            monkeypatch.setenv("KVSCOPE_BACKEND_TOKEN", token)
        _clear()

    yield point
    _clear()


def _clear() -> None:
    get_settings.cache_clear()
    client._http.clear()
    client.summary.clear()


def test_version_moves_with_new_spans_and_reads_see_them(point_client_at, tmp_path):
    settings = Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", token="read-me")
    with RunningBackend(settings) as backend:
        point_client_at(backend.url, "read-me")
        before = client.data_version()
        scheduler = Process("kvscope-scheduler", "engine-c", "scheduler")
        worker = Process("kvscope-worker", "engine-c", "worker")
        load_story(scheduler, worker, None, "client-1", time.time_ns() - 50 * MS)
        backend.export(scheduler.spans() + worker.spans())
        after = client.data_version()
        assert after > before
        assert sum(client.summary(after, 300.0)["requests"].values()) == 1
        hits = client.hit_rates(after, 300.0)
        assert hits[0]["hit_requests"] == 1 and hits[0]["external_hit_tokens"] == 64
        history = client.block_history(after, "engine-c", "host", 3)
        assert [lease["holder"] for lease in history["leases"]] == ["client-1"]


def test_unreachable_backend_and_wrong_token_are_told_apart(point_client_at, tmp_path):
    point_client_at(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(client.BackendUnreachable):
        client.data_version()
    settings = Settings(database_url=f"sqlite:///{tmp_path}/db.sqlite", token="right")
    with RunningBackend(settings) as backend:
        point_client_at(backend.url, "wrong")
        with pytest.raises(client.BackendRefused):
            client.summary(0, 60.0)


def test_launch_command_is_headless_and_watches_no_files():
    line = launch.command("127.0.0.1", 8600)
    assert line[1:4] == ["-m", "streamlit", "run"] and line[4].endswith("dashboard/app.py")
    assert line[line.index("--server.headless") + 1] == "true"
    assert line[line.index("--server.fileWatcherType") + 1] == "none"
