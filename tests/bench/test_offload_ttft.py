"""The offload TTFT bench end to end on the tiny model: two lengths, each figure recorded."""

import pytest

from kvscope.bench.common.results import RESULTS_ENV, load


@pytest.mark.engine
def test_offload_ttft_records_per_length_figures(tmp_path, monkeypatch, tiny_model):
    from kvscope.bench.engine import offload_ttft

    results = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(results))
    argv = [
        "--model",
        str(tiny_model),
        "--prefix-tokens",
        "256,512",
        "--repeats",
        "2",
        "--rounds",
        "1",
    ]
    assert offload_ttft.main(argv) == 0
    figures = {row["metric"]: row["value"] for row in load(results)}
    assert set(figures) == {
        "ttft_hit_over_recompute_tiny_256",
        "ttft_hit_over_recompute_tiny_512",
        "ttft_recompute_tiny_256_ms",
        "ttft_recompute_tiny_512_ms",
        "ttft_hit_tiny_256_ms",
        "ttft_hit_tiny_512_ms",
    }
    assert all(value > 0 for value in figures.values())


def test_prefix_lengths_are_checked():
    import argparse

    from kvscope.bench.engine.offload_ttft import parse_lengths

    assert parse_lengths("1024,2048") == [1024, 2048]
    with pytest.raises(argparse.ArgumentTypeError, match="at least 32 tokens"):
        parse_lengths("8")
