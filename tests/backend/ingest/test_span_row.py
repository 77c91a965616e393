"""The span row's JSON text: what the reads parse back is what was decoded."""

import json

from hypothesis import given
from hypothesis import strategies as st

from kvscope.backend.ingest.span_row import json_text

_LEAVES = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text()
_FINITE = st.floats(allow_nan=False, allow_infinity=False)
_TREES = st.recursive(
    _LEAVES | _FINITE,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(st.dictionaries(st.text(), _TREES, max_size=8))
def test_attribute_trees_read_back_as_written(attributes):
    assert json.loads(json_text(attributes)) == attributes


def test_text_that_utf8_cannot_carry_still_becomes_json():
    attributes = {"kvscope.note": "caf\u00e9 \ud800", "n": [1, 2]}
    assert json.loads(json_text(attributes)) == attributes


def test_non_ascii_text_is_stored_as_itself():
    assert json_text({"k": "caf\u00e9"}) == '{"k":"caf\u00e9"}'
