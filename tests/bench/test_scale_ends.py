"""bench.scale.end_rates: each end's rate is taken over a tenth of the fill, not one stretch."""

from kvscope.bench.scale import end_rates


def test_each_end_covers_a_tenth_of_the_spans_weighted_by_time():
    # 20 stretches of 100 spans: the first two take 1 s each, the last two 2 s and 3 s.
    stretches = [(100, 1.0, 0.5)] * 18 + [(100, 2.0, 1.0), (100, 3.0, 2.0)]
    assert end_rates(stretches) == (100.0, 200.0)
    assert end_rates(stretches[::-1]) == (200 / 5.0, 200 / 3.0)  # not the last stretch alone


def test_a_short_fill_still_has_a_stretch_at_each_end():
    assert end_rates([(50, 2.0, 1.0)]) == (25.0, 50.0)
