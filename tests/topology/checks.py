"""Assertions both topology modules make on the recorded runs."""

from kvscope.harness.oracle import token_mismatches
from tests.topology.runs import Passes, Pulls


def assert_store_then_hit(passes: Passes, expected: list[list[int]]) -> None:
    """Same greedy tokens as no connector, both passes; the second served by external hits."""
    assert token_mismatches(expected, passes.first) == []
    assert token_mismatches(expected, passes.second) == []
    assert passes.external_hits >= 64 * len(expected), "two blocks a prompt at least"


def assert_pulled(pulls: Pulls, expected: list[list[int]]) -> None:
    """Decode's tokens equal no connector's; every prompt token but the last was pulled, and
    vLLM counts them under the p2p cache-hit source."""
    assert token_mismatches(expected, pulls.tokens) == []
    wanted = sum(n - 1 for n in pulls.prompt_lengths)
    assert pulls.external_hits == wanted
    assert pulls.p2p_hits == wanted


def p2p_stats(ranks: list[dict], child: str) -> dict[int, dict]:
    """Each rank's P2P counters, by tp rank."""
    return {stats["tp_rank"]: stats[child] for stats in ranks}
