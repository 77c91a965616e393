"""The scale-out bench at smoke size: 1 and 2 backends on one PostgreSQL store every span sent."""

import os

import pytest
from sqlalchemy import create_engine, text

from kvscope.backend.db.database import normalized_url
from kvscope.bench.backend import scale_out
from kvscope.bench.common.results import RESULTS_ENV, load
from tests.backend.conftest import POSTGRES_URL, SKIP_POSTGRES

pytestmark = [pytest.mark.skipif(not POSTGRES_URL, reason=SKIP_POSTGRES), pytest.mark.timeout(300)]


def _bench_databases() -> list[str]:
    engine = create_engine(normalized_url(POSTGRES_URL))
    try:
        with engine.connect() as connection:
            query = text("SELECT datname FROM pg_database WHERE datname LIKE 'kvscope_scale_out_%'")
            return list(connection.execute(query).scalars())
    finally:
        engine.dispose()


def test_every_span_sent_is_stored_with_one_and_two_backends(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(RESULTS_ENV, str(tmp_path / "results.jsonl"))
    before = _bench_databases()

    outcomes = scale_out.run(POSTGRES_URL, spans=4000, clients=2, counts=[1, 2])

    assert [outcome.backends for outcome in outcomes] == [1, 2]
    for outcome in outcomes:
        assert outcome.sent >= 3000
        assert outcome.stored == outcome.sent  # counted in the shared database
        assert sum(outcome.stored_by_backend) == outcome.sent  # and as the backends report it
        assert all(stored > 0 for stored in outcome.stored_by_backend)  # each one took batches
        assert outcome.backend_cpu > 0
    figures = {row["metric"]: row["value"] for row in load(tmp_path / "results.jsonl")}
    assert figures["spans_missing_1_backend"] == figures["spans_missing_2_backends"] == 0
    ratio = outcomes[1].rate / outcomes[0].rate
    assert figures["spans_per_s_2_backends_over_1"] == pytest.approx(ratio)
    printed = capsys.readouterr().out
    assert f"one machine of {os.cpu_count()} cores" in printed
    assert "aggregate spans/s, 2 backends over 1:" in printed
    assert _bench_databases() == before  # each count's database was dropped
