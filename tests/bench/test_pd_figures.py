"""The P/D bench's statistics and phase breakdown on made-up samples and span files."""

import json
import math
from pathlib import Path

from kvscope.bench.common.spread import Spread, median_interval, median_ratio_interval
from kvscope.bench.pd.pd_phases import (
    POINTS,
    TimedRequest,
    gap_names,
    report_phases,
    request_gaps,
    server_points,
)


def test_spread_reports_median_quartiles_and_range_without_nan():
    spread = Spread.of([0.4, 0.1, float("nan"), 0.2, 0.3, 5.0])
    assert (spread.median, spread.low, spread.high, spread.count) == (0.3, 0.1, 5.0, 5)
    assert spread.q1 <= spread.median <= spread.q3
    assert "n=5" in spread.text(1000, " ms")
    assert math.isnan(Spread.of([]).median)


def test_ratio_interval_holds_the_ratio_and_widens_with_noise():
    steady = median_ratio_interval([0.10] * 15, [0.20] * 15)
    assert steady == (0.5, 0.5)
    noisy = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 1.5, 1.5, 1.5, 1.5, 1.5]
    low, high = median_ratio_interval(noisy, [0.2] * 11)
    assert low <= 0.5 and high >= 7.5  # a bimodal sample gives no tight ratio
    assert median_ratio_interval(noisy, [0.2] * 11) == (low, high)  # seeded: repeatable


def test_median_interval_narrows_with_more_rounds():
    assert median_interval([0.97] * 9) == (0.97, 0.97)
    few = [0.90, 1.05, 0.97, 0.99, 0.93]
    low, high = median_interval(few)
    assert low <= 0.97 <= high
    many_low, many_high = median_interval(few * 20)
    assert many_high - many_low < high - low
    assert median_interval(few) == (low, high)  # seeded: repeatable
    assert all(math.isnan(v) for v in median_interval([float("nan")]))


def _span(
    name: str, start_s: float, events: tuple[tuple[str, float], ...] = (), req_id: str = "r1"
) -> dict:
    return {
        "name": name,
        "startTimeUnixNano": str(int(start_s * 1e9)),
        "attributes": [{"key": "gen_ai.request.id", "value": {"stringValue": req_id}}],
        "events": [
            {
                "timeUnixNano": str(int(t * 1e9)),
                "attributes": [{"key": "kvscope.timeline.point", "value": {"stringValue": point}}],
            }
            for point, t in events
        ],
    }


def _write_spans(path: Path, spans: list[dict]) -> None:
    lines = [json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [s]}]}]}) for s in spans]
    path.write_text("\n".join(lines) + "\n")


def test_phases_split_a_request_into_its_gaps(tmp_path, capsys):
    t = 1000.0
    _write_spans(
        tmp_path / "prefill_spans.jsonl",
        [
            _span("kvscope.request", t + 0.005),
            _span("kvscope.hook.request_finished", t + 0.015),
            _span("kvscope.worker.request", t + 0.040, (("send_complete", t + 0.045),)),
            _span("kvscope.request.event", t + 0.020, (("send_complete", t + 0.020),), "r0"),
        ],
    )
    _write_spans(
        tmp_path / "decode_spans.jsonl",
        [
            _span("kvscope.request", t + 0.030, (("resumed", t + 0.050),)),
            _span("kvscope.worker.request", t + 0.032, (("transfer_submitted", t + 0.032),)),
            _span("kvscope.request.event", t + 0.046, (("transfer_complete", t + 0.046),)),
            _span("kvscope.worker.request", t + 0.052, (("forward_start", t + 0.053),)),
        ],
    )
    request = TimedRequest(t, t + 0.070, t + 0.100)
    points = sorted(
        p
        for role in ("prefill", "decode")
        for p in server_points(tmp_path / f"{role}_spans.jsonl", role)
    )
    gaps = dict(zip(gap_names(), request_gaps(request, points), strict=True))
    assert round(gaps[("prefill.finished", "decode.lookup")]) == 15
    assert round(gaps[("decode.transfer_submitted", "decode.transfer_complete")]) == 14
    assert round(gaps[("decode.forward_start", "client_first_token")]) == 17
    # the previous request's late release inside this window is not this request's
    assert round(gaps[("decode.transfer_submitted", "prefill.send_complete")]) == 13
    critical = [gaps[pair] for pair in zip(POINTS, POINTS[1:], strict=False)]
    assert round(sum(critical)) == 70  # the critical path adds up to the TTFT
    report_phases([request], tmp_path, "made up")
    assert "decode.lookup -> decode.transfer_submitted" in capsys.readouterr().out


def test_per_length_figures_are_named_by_shape_and_length(tmp_path, monkeypatch):
    from kvscope.bench.common.results import RESULTS_ENV, length_metric, load
    from kvscope.bench.pd import pd_latency, pd_report

    assert [length_metric("r", "mid", n, 3) for n in (1024, 2048, 4096)] == [
        "r_1k",
        "r_mid",
        "r_4k",
    ]
    assert length_metric("r", "tiny", 1024, 1) == "r"
    assert length_metric("r", "tiny", 512, 2) == "r_tiny_512"
    assert pd_latency.headline([1024, 2048, 4096]) == 2048
    assert pd_latency.headline([]) == 0

    results = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(results))
    plain = pd_report.PairFigures("plain unpinned", 2048)
    ours = pd_report.PairFigures("ours unpinned", 2048)
    for tokens, single_s, pd_s in ((1024, 1.0, 1.1), (2048, 2.0, 2.1), (4096, 4.0, 4.8)):
        plain.samples(tokens).ttft_s.extend([single_s] * 3)
        ours.samples(tokens).ttft_s.extend([pd_s] * 3)
    pd_report._report_single({figures.name: figures for figures in (plain, ours)}, "mid")
    figures = {row["metric"]: row for row in load(results)}
    assert math.isclose(figures["ttft_over_single_mid"]["value"], 1.05)
    assert figures["ttft_over_single_mid"]["target"] == "<= 1.2"
    assert math.isclose(figures["ttft_over_single_4k"]["value"], 1.2)
    assert figures["ttft_over_single_1k"]["target"] == ""
    assert figures["ttft_pd_mid_4096_ms"]["value"] == 4800.0
    assert figures["ttft_single_mid_1024_ms"]["value"] == 1000.0
    assert ours.ttft_s == [2.1] * 3  # the headline length's samples
