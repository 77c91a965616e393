"""A wrapped connector's stats reach vLLM's Prometheus metrics exactly as the bare connector's:
kvscope's offload core under TracedConnector against the CpuOffloadConnector users load, in a
real engine, read back with prometheus_client's parser from the registry vLLM exports."""

import prometheus_client
import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kvscope.harness.configs import engine_config, traced_child
from kvscope.harness.engine import in_process_llm
from kvscope.harness.oracle import greedy_tokens
from kvscope.harness.prompts import long_prompt
from tests.connector.cpu_offload.test_offload_serve_metrics import OFFLOAD
from tests.connector.prom_scrape import parsed

pytestmark = [pytest.mark.engine, pytest.mark.timeout(300)]
PROMPT = long_prompt(2, sentences=6)
FAMILY = "vllm:kvscope_offload_"

TRACED_CORE = engine_config(
    traced_child(
        "CpuOffloadCore",
        connector_module_path="kvscope.connector.cpu_offload.core",
        **OFFLOAD["kv_connector_extra_config"],
    ),
    policy=OFFLOAD["kv_load_failure_policy"],
)
"""The offload connector's core, which traces nothing itself, wrapped by TracedConnector."""


def logged_stats(llm) -> KVConnectorStats | None:
    """What vLLM's logging stat logger has accumulated for its next 'KV Transfer metrics'."""
    for stat_logger in llm.llm_engine.logger_manager.stat_loggers:
        for per_engine in getattr(stat_logger, "per_engine_stat_loggers", {}).values():
            if (logging := getattr(per_engine, "kv_connector_logging", None)) is not None:
                return logging.transfer_stats_accumulator
    raise AssertionError("vLLM built no logging stat logger: is disable_log_stats on?")


def untimed(values: dict) -> dict:
    return {k: v for k, v in values.items() if not k.endswith(("_s", "_gb_per_s"))}


def offload_run(config: dict, tiny_model) -> tuple[dict[tuple, float], KVConnectorStats | None]:
    """(every kvscope offload sample, what the logger would print) after a store and a load of
    one prompt, timings left out."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_LOG_STATS_INTERVAL", "3600")  # nothing logged (and reset) midway
        with in_process_llm(tiny_model, config) as llm:
            greedy_tokens(llm, [PROMPT], max_tokens=4)
            greedy_tokens(llm, ["one more step"], max_tokens=1)  # the stores' last reports
            for _ in range(5):  # blocks held for stores are freed after a step
                if llm.reset_prefix_cache():
                    break
                greedy_tokens(llm, ["one more step"], max_tokens=1)
            else:
                raise AssertionError("the prefix cache never reset: a store never finished")
            greedy_tokens(llm, [PROMPT], max_tokens=4)
            greedy_tokens(llm, ["one more step"], max_tokens=1)
            found = parsed(prometheus_client.generate_latest().decode())
            logged = logged_stats(llm)
    samples = {
        (name, tuple(sorted(labels.items()))): value
        for name, samples in found.items()
        if name.startswith(FAMILY) and "_seconds" not in name and not name.endswith("_created")
        for labels, value in samples
    }
    return samples, logged


@pytest.fixture(scope="module")
def bare_and_traced(tiny_model):
    return offload_run(OFFLOAD, tiny_model), offload_run(TRACED_CORE, tiny_model)


def test_the_traced_connectors_metrics_are_the_bare_ones(bare_and_traced):
    (bare, _), (traced, _) = bare_and_traced
    assert bare == traced


def test_vllms_logger_keeps_the_traced_connectors_stats_as_the_bare_ones(bare_and_traced):
    """Not dropped with 'Stats will not be logged': rebuilt by the wrapped class."""
    (_, bare), (_, traced) = bare_and_traced
    assert bare is not None and traced is not None
    assert type(traced) is type(bare)
    assert untimed(traced.reduce()) == untimed(bare.reduce())


def test_the_metrics_compared_saw_the_store_and_the_load(bare_and_traced):
    """Else the comparison above would hold for two empty sets."""
    (bare, _), _ = bare_and_traced
    totals = {name: value for (name, _), value in bare.items() if value}
    assert totals.get(FAMILY + "stored_blocks_total", 0) > 0
    assert totals.get(FAMILY + "loaded_blocks_total", 0) > 0
