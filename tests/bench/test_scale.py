"""bench.scale: a fill at smoke size, profiled (real py-spy), and each end's rate taken over a
tenth of the fill, not one stretch."""

import json
import re

import pytest
from sqlalchemy import create_engine, text

from kvscope.backend.db.database import normalized_url
from kvscope.bench.backend import scale
from kvscope.bench.backend.scale import end_rates
from tests.backend.conftest import POSTGRES_URL, SKIP_POSTGRES


def test_a_small_fill_measures_reads_and_compares_its_ends(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(scale, "CHUNK", 1000)  # a stretch of about two batches
    url = f"sqlite:///{tmp_path}/scale.db"
    scale.run("sqlite", url, 12_000, 3, profile=tmp_path / "profiles")
    out = capsys.readouterr().out
    assert "sqlite: 11,960 spans in 23 batches" in out
    assert "ingest: empty " in out and "timeline: p50" in out and "bytes per span" in out
    assert "profile, last tenth against first (py-spy, every thread):" in out
    last = json.loads((tmp_path / "profiles" / "sqlite-last.json").read_text())
    assert last["arm"] == "last tenth" and last["unit"] == "s"
    # What py-spy sampled is not asserted: a smoke fill's tenth lasts about 100 ms, and under the
    # suite's load it may hold no sample at all (CI saw one without a backend frame). That py-spy's
    # samples name the functions at work is test_profiles' check, on a process of known work.
    assert isinstance(last["functions"], dict)


@pytest.mark.skipif(not POSTGRES_URL, reason=SKIP_POSTGRES)
@pytest.mark.timeout(300)
def test_postgres_is_filled_after_sqlite_with_the_servers_cpu_counted(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(scale, "CHUNK", 1000)
    scale.main(["--spans", "6000", "--samples", "2", "--workdir", str(tmp_path)])
    assert "postgres:" not in capsys.readouterr().out  # SQLite alone unless asked
    scale.main(
        [
            "--spans",
            "6000",
            "--samples",
            "2",
            "--workdir",
            str(tmp_path),
            "--postgres",
            POSTGRES_URL,
        ]
    )
    out = capsys.readouterr().out
    assert "sqlite: 5,720 spans" in out and "postgres: 5,720 spans" in out
    name = re.search(r"postgres: database (kvscope_scale_[0-9a-f]+),", out).group(1)
    # The server runs here (scripts/postgres.sh): its CPU joins the backend's.
    assert "s in the server: " in out and "spans per CPU-second of both" in out
    assert out.count("timeline: p50") == 2
    assert not _database_exists(name)  # the bench's database was dropped


def _database_exists(name: str) -> bool:
    engine = create_engine(normalized_url(POSTGRES_URL))
    try:
        with engine.connect() as connection:
            query = text("SELECT 1 FROM pg_database WHERE datname = :name")
            return connection.execute(query, {"name": name}).first() is not None
    finally:
        engine.dispose()


def test_each_end_covers_a_tenth_of_the_spans_weighted_by_time():
    # 20 stretches of 100 spans: the first two take 1 s each, the last two 2 s and 3 s.
    stretches = [(100, 1.0, 0.5)] * 18 + [(100, 2.0, 1.0), (100, 3.0, 2.0)]
    assert end_rates(stretches) == (100.0, 200.0)
    assert end_rates(stretches[::-1]) == (200 / 5.0, 200 / 3.0)  # not the last stretch alone


def test_a_short_fill_still_has_a_stretch_at_each_end():
    assert end_rates([(50, 2.0, 1.0)]) == (25.0, 50.0)
