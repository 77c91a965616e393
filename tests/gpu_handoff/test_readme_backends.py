"""docs/connectors/cuda.md's backend table is the harness's table, rendered."""

from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.gpu_handoff.readme_table import END, START, render  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / "docs" / "connectors" / "cuda.md"


def test_the_docs_table_is_rendered_from_the_backend_table():
    text = PAGE.read_text()
    assert START in text and END in text, "docs/connectors/cuda.md lost the table's markers"
    shown = text[text.index(START) : text.index(END) + len(END)]
    assert shown == render(), "run python -m tests.gpu_handoff.readme_table and paste its output"
