"""runs_of: a batch's (seq, start_ns) pairs as the runs the writer merges, whatever their order."""

import random

from kvscope.backend.db.seqs import runs_of


def _runs_by_definition(items):
    """Each maximal set of consecutive seqs: (lo, hi, start of lo, start of hi), the earliest
    start where a seq came twice."""
    starts = {}
    for seq, start_ns in items:
        starts[seq] = min(start_ns, starts.get(seq, start_ns))
    runs, seqs = [], sorted(starts)
    for seq in seqs:
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq, runs[-1][2], starts[seq])
        else:
            runs.append((seq, seq, starts[seq], starts[seq]))
    return runs


def test_consecutive_seqs_make_one_run_and_gaps_split_them():
    items = [(5, 50), (3, 30), (4, 40), (9, 90), (10, 100), (3, 31)]
    assert runs_of(items) == [(3, 5, 30, 50), (9, 10, 90, 100)]
    assert runs_of([]) == []


def test_runs_match_their_definition_for_shuffled_repeated_and_negative_seqs():
    rng = random.Random(7)
    for _ in range(500):
        items = [(rng.randint(-3, 30), rng.randint(0, 9)) for _ in range(rng.randint(1, 40))]
        rng.shuffle(items)
        assert runs_of(items) == _runs_by_definition(items)
