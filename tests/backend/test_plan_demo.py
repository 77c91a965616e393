"""GET /api/v1/plan and `kvscope plan` on the shipped demo recording, replayed into a backend."""

import pytest

from kvscope.cli.main import main as kvscope
from kvscope.demo.replay import RECORDINGS, replay


@pytest.fixture(scope="module")
def demo_backend(tmp_path_factory):
    from kvscope.backend.settings import Settings
    from tests.backend.conftest import RunningBackend

    url = f"sqlite:///{tmp_path_factory.mktemp('plan-demo') / 'kvscope.db'}"
    with RunningBackend(Settings(database_url=url, ingest_workers=0)) as backend:
        replay(RECORDINGS / "demo.jsonl.gz", backend.url, None, 0, now=True)
        yield backend


def test_the_demo_recording_names_its_engines_as_not_replayable(demo_backend):
    """It dates from before lookups recorded what they asked: the plan says so for each
    engine whose pool stored blocks, and offers no invented numbers."""
    with demo_backend.client() as client:
        report = client.get("/api/v1/plan", params={"window": 10**6}).json()
    assert report["engines"] == []
    assert len(report["not_replayable"]) == 2  # the prefill and the decode engine


def test_bad_sizes_are_refused_with_what_to_send(demo_backend):
    with demo_backend.client() as client:
        answer = client.get("/api/v1/plan", params={"sizes": "half"})
    assert answer.status_code == 422 and "comma" in answer.json()["detail"]


def test_the_cli_says_why_there_is_nothing_to_replay(demo_backend, capsys):
    assert kvscope(["plan", "--backend", demo_backend.url, "--window", "1000000"]) == 1
    out = capsys.readouterr().out
    assert out.count("did not record the blocks they asked") == 2
