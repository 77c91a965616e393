"""bench.paired_engines.balanced_orders: every place and every predecessor equally often."""

from collections import Counter
from itertools import pairwise

import pytest

from kvscope.bench.common.paired_engines import balanced_orders


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6])
def test_each_engine_takes_each_place_and_follows_each_other_equally_often(count):
    orders = balanced_orders(count)
    assert all(sorted(order) == list(range(count)) for order in orders)
    places = Counter((item, place) for order in orders for place, item in enumerate(order))
    assert len(places) == count * count and len(set(places.values())) == 1
    follows = Counter(pair for order in orders for pair in pairwise(order))
    assert len(follows) == count * (count - 1) and len(set(follows.values())) == 1
