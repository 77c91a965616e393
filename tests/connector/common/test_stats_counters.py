"""A half's typed Counters against its stats schema: unknown names refused where the class is
defined, and the wire dict they become passes the schema's own check."""

from dataclasses import dataclass

import pytest

from kvscope.connector.common.stats_schema import Counters, IntervalReporter, Samples
from kvscope.connector.cpu_offload.stats import SCHEMA, OffloadStats


def test_a_counter_the_schema_does_not_name_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match=r"\['lookupz'\].*add them to its counters"):

        @SCHEMA.counted_by
        @dataclass
        class Misspelt(Counters):
            lookupz: int = 0


def test_counters_become_the_wire_dict_the_schema_checks():
    @SCHEMA.counted_by
    @dataclass
    class Some(Counters):
        lookups: int = 0
        load_s: float = 0.0

    counters = Some()
    counters.lookups += 2
    counters.load_s += 0.5
    assert counters.as_dict() == {"lookups": 2, "load_s": 0.5}
    assert counters["lookups"] == 2
    snapshot = dict(counters)
    counters.lookups += 1
    assert snapshot == {"lookups": 2, "load_s": 0.5}, "a snapshot, not a view"
    with pytest.raises(KeyError, match="no counter 'hit_tokens'"):
        counters["hit_tokens"]
    stats = IntervalReporter(OffloadStats).report(counters.as_dict(), {}, Samples())
    assert SCHEMA.checked(stats.data)["counters"] == {"lookups": 3, "load_s": 0.5}
