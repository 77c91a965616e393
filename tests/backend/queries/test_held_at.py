"""The overview's "Leases held" series: a count of held leases, so never below 0."""

from hypothesis import given
from hypothesis import strategies as st

from kvscope.backend.queries.aggregates import held_at


def test_a_lease_held_between_its_start_and_end():
    assert held_at([(10, 20)], [5, 10, 15, 20, 25]) == [0, 1, 1, 0, 0]


def test_an_open_lease_stays_held():
    assert held_at([(10, None)], [5, 15, 1000]) == [0, 1, 1]


def test_a_lease_ending_before_it_started_is_never_counted_below_zero():
    # The end was stamped in another process whose clock runs 3 units behind.
    assert held_at([(10, 7), (12, 30)], [5, 8, 11, 13, 31]) == [0, 0, 0, 1, 0]


@given(
    st.lists(
        st.tuples(st.integers(0, 100), st.one_of(st.none(), st.integers(0, 100))), max_size=20
    ),
    st.lists(st.integers(0, 120), max_size=20),
)
def test_the_count_is_never_negative_nor_more_than_the_leases(leases, times):
    counts = held_at(leases, sorted(times))
    assert all(0 <= count <= len(leases) for count in counts)
