"""Every connector at tensor_parallel_size=2 on the CPU platform: two worker processes (one core
each), the scheduler in this process, so both halves are checked directly, rank by rank."""

import pytest

from kvscope.harness.oracle import token_mismatches
from kvscope.harness.prompts import DISTINCT
from tests.oracle_cache import prompt_set
from tests.topology.checks import assert_pulled, assert_store_then_hit, p2p_stats
from tests.topology.configs import offload_config, traced_example_config
from tests.topology.runs import MAX_TOKENS, environ
from tests.topology.suite import Topology, run_alone, run_pd

pytestmark = [pytest.mark.engine, pytest.mark.slow]
PROMPTS = DISTINCT[:2]
BASELINE = prompt_set(PROMPTS, MAX_TOKENS, tp_size=2)
TP2 = Topology(executor="mp", scheduler_in_process=True, tp_size=2)
EXAMPLE_TP_BUG = (
    "vLLM's ExampleConnector names its files by token hash and layer, not by rank: at TP=2 both"
    " ranks write their shard to the same file, and a hit loads one rank's heads on both"
)
SHARD_BYTES_PER_BLOCK = 2 * 1 * 32 * 64 * 2  # layers, KV heads per rank (2 of 2), tokens, K+V, bf16


@pytest.fixture(scope="module", autouse=True)
def two_ranks():
    """vLLM refuses TP=2 on two cores unless each rank's OpenMP team is bound to its own core."""
    with environ(
        VLLM_CPU_OMP_THREADS_BIND="0|1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
    ):
        yield


@pytest.fixture(scope="module")
def expected(oracle):
    """Greedy tokens without a connector at TP=2 (they differ from TP=1's)."""
    return oracle.tokens(BASELINE)


@pytest.fixture(scope="module")
def offload(tiny_model, expected):
    return run_alone(tiny_model, offload_config(), PROMPTS, 2, None)


@pytest.fixture(scope="module")
def traced_example(tiny_model, expected, tmp_path_factory):
    storage = str(tmp_path_factory.mktemp("example-kv-tp2"))
    return run_alone(tiny_model, traced_example_config(storage), PROMPTS, 2, None)


@pytest.fixture(scope="module")
def pd(tiny_model, expected):
    return run_pd(tiny_model, PROMPTS, 2, None)


def test_offload_at_tp2(offload, expected):
    assert offload.topology == TP2
    assert_store_then_hit(offload.passes, expected)
    assert offload.passes.leaks == []


def test_traced_example_connector_at_tp2(traced_example, expected):
    passes = traced_example.passes
    assert traced_example.topology == TP2
    assert token_mismatches(expected, passes.first) == []
    assert passes.external_hits >= 64 * len(PROMPTS)
    assert passes.leaks == []


@pytest.mark.xfail(strict=True, reason=EXAMPLE_TP_BUG)
def test_traced_example_connector_hits_give_the_same_tokens_at_tp2(traced_example, expected):
    assert token_mismatches(expected, traced_example.passes.second) == []


def test_p2p_each_decode_rank_pulls_its_own_shard(pd, expected):
    assert pd.topologies == [TP2, TP2]
    assert_pulled(pd.p2p, expected)
    assert pd.p2p.leaks == []
    blocks = sum(-(-(n - 1) // 32) for n in pd.p2p.prompt_lengths)
    ranks = p2p_stats(pd.p2p.decode_stats, "P2PCore")
    assert sorted(ranks) == [0, 1]
    for rank, stats in ranks.items():
        assert stats["reads"] == len(PROMPTS), rank
        assert stats["read_bytes"] == blocks * SHARD_BYTES_PER_BLOCK, rank
        assert stats["handshakes"] == 1, rank


def test_multi_at_tp2(pd, expected):
    assert_pulled(pd.multi, expected)
    assert_store_then_hit(pd.multi_passes, expected)
    assert pd.multi_passes.leaks == []
    ranks = p2p_stats(pd.multi.decode_stats, "p2p")
    assert sorted(ranks) == [0, 1] and all(s["reads"] == len(PROMPTS) for s in ranks.values())


def test_prefill_ranks_freed_every_block_once_read(pd):
    assert pd.prefill_leaks == []
    ranks = p2p_stats(pd.prefill_stats, "P2PCore")
    assert sorted(ranks) == [0, 1]
    for rank, lender in ranks.items():
        assert lender["reads_notified"] == 2 * len(PROMPTS), rank  # from the same decode rank
        assert lender["leases_expired"] == 0, rank
