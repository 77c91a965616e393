"""Every connector under vLLM's default executor on the CPU: the engine core (scheduler) and the
model's worker each in a process of their own, as `vllm serve` runs by default."""

import pytest

from kvscope.harness.prompts import DISTINCT
from tests.oracle_cache import prompt_set
from tests.topology.checks import assert_pulled, assert_store_then_hit, p2p_stats
from tests.topology.configs import offload_config, traced_example_config
from tests.topology.runs import MAX_TOKENS, environ
from tests.topology.suite import Topology, run_alone, run_pd

pytestmark = [pytest.mark.engine, pytest.mark.slow]
PROMPTS = DISTINCT[:2]
BASELINE = prompt_set(PROMPTS, MAX_TOKENS)
DEFAULT = Topology(executor="mp", scheduler_in_process=False, tp_size=1)


@pytest.fixture(scope="module")
def expected(oracle):
    """The tokens without a connector: the executor does not change the arithmetic at TP=1."""
    return oracle.tokens(BASELINE)


@pytest.fixture(scope="module")
def spans_file(tmp_path_factory, expected):
    """vLLM's defaults for this module's engines; every engine process appends its spans here."""
    path = tmp_path_factory.mktemp("default-executor") / "spans.jsonl"
    with environ(
        VLLM_ENABLE_V1_MULTIPROCESSING="1",  # vLLM's default
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",  # leak probes sent by collective_rpc
        KVSCOPE_TRACES_FILE=str(path),
        OTEL_BSP_SCHEDULE_DELAY="100",
    ):
        yield path


@pytest.fixture(scope="module")
def offload(tiny_model, spans_file):
    return run_alone(tiny_model, offload_config(), PROMPTS, 1, spans_file)


@pytest.fixture(scope="module")
def traced_example(tiny_model, spans_file, tmp_path_factory):
    storage = str(tmp_path_factory.mktemp("example-kv"))
    return run_alone(tiny_model, traced_example_config(storage), PROMPTS, 1, spans_file)


@pytest.fixture(scope="module")
def pd(tiny_model, spans_file):
    return run_pd(tiny_model, PROMPTS, 1, spans_file)


def test_offload_under_the_default_executor(offload, expected):
    assert offload.topology == DEFAULT
    assert_store_then_hit(offload.passes, expected)
    assert offload.passes.leaks == []


def test_traced_example_connector_under_the_default_executor(traced_example, expected):
    assert traced_example.topology == DEFAULT
    assert_store_then_hit(traced_example.passes, expected)
    assert traced_example.passes.leaks == []


def test_p2p_prefill_and_decode_under_the_default_executor(pd, expected):
    assert pd.topologies == [DEFAULT, DEFAULT]
    assert_pulled(pd.p2p, expected)
    assert pd.p2p.leaks == []
    assert p2p_stats(pd.p2p.decode_stats, "P2PCore")[0]["reads"] == len(PROMPTS)


def test_multi_decodes_and_serves_offload_hits_under_the_default_executor(pd, expected):
    assert_pulled(pd.multi, expected)
    assert_store_then_hit(pd.multi_passes, expected)
    assert pd.multi_passes.leaks == []


def test_prefill_engine_freed_every_block_once_read(pd):
    assert pd.prefill_leaks == []
    lender = p2p_stats(pd.prefill_stats, "P2PCore")[0]
    assert lender["reads_notified"] == 2 * len(PROMPTS)  # the P2P and the Multi decode engines
    assert lender["leases_expired"] == 0
