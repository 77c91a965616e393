"""The tracing bench's --label: another model's ratios under their own names in the report."""

import json
from pathlib import Path

import pytest

from kvscope.bench.engine import tracing_overhead
from kvscope.bench.report.figures.engine import ENGINE_FIGURES

STANDING = Path(__file__).parents[2] / "docs" / "bench" / "tracing_overhead_mid_model.jsonl"


def test_a_label_must_fit_a_figure_name(capsys) -> None:
    assert tracing_overhead.label("mid_model") == "mid_model"
    with pytest.raises(SystemExit) as stopped:  # argparse refuses it before any engine starts
        tracing_overhead.main(["--label", "Mid-Model"])
    assert stopped.value.code == 2
    assert "use lower-case letters, digits and _" in capsys.readouterr().err


def test_the_mid_model_rows_are_the_labelled_runs_figures() -> None:
    """Every *_mid_model row the report expects is one the labelled runs recorded, with no
    target: the targets are the tiny model's."""
    recorded = {record["metric"]: record for record in map(json.loads, STANDING.open())}
    tiny = {f.metric for f in ENGINE_FIGURES}
    rows = [f for f in ENGINE_FIGURES if f.metric.endswith("_mid_model")]
    assert len(rows) == 5
    for row in rows:
        assert row.target == "" and recorded[row.metric]["target"] == ""
        assert row.metric.removesuffix("_mid_model") in tiny
