"""The convoy bench end to end on the tiny model: both offload arms timed against recompute, the
oracle held, every figure recorded."""

import pytest

from kvscope.bench.common.results import RESULTS_ENV, load

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]


def test_convoy_bursts_records_each_burst_size_figures(tmp_path, monkeypatch, tiny_model):
    from kvscope.bench.engine import convoy_bursts

    results = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(results))
    argv = ["--model", str(tiny_model), "--prefix-tokens", "256", "--bursts", "1,4"]
    assert convoy_bursts.main([*argv, "--repeats", "1", "--rounds", "1", "--max-tokens", "2"]) == 0
    figures = {row["metric"]: row for row in load(results)}
    names = {
        f"{kind}_n{n}"
        for n in (1, 4)
        for kind in (
            "ttft_p50_over_recompute",
            "ttft_p99_over_recompute",
            "tokens_per_s_over_recompute",
            "ttft_p50_load_each_over_recompute",
            "tokens_per_s_load_each_over_recompute",
        )
    }
    assert set(figures) == names
    assert all(row["value"] > 0 for row in figures.values())
    assert figures["tokens_per_s_over_recompute_n4"]["target"] == ">= 1.0"


def test_burst_sizes_are_checked():
    import argparse

    from kvscope.bench.engine.convoy_bursts import parse_sizes

    assert parse_sizes("1,4,16") == [1, 4, 16]
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        parse_sizes("0")
