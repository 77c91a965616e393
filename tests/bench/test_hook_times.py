"""The hook timer on a real TracedConnector around vLLM's ExampleConnector: counts per arm, the
wrapper and the wrapped connector apart, and the classes left as they were."""

from vllm.config import VllmConfig
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

from kvscope.bench.engine.hook_times import INNER, HookTimes, compare
from kvscope.bench.engine.tracing_switch import set_traced
from kvscope.connector.traced import TracedConnector


def worker(tmp_path) -> TracedConnector:
    config = KVTransferConfig(
        kv_connector="TracedConnector",
        kv_connector_module_path="kvscope.connector.traced",
        kv_role="kv_both",
        kv_connector_extra_config={
            "connector": "ExampleConnector",
            "shared_storage_path": str(tmp_path),
        },
    )
    return TracedConnector(VllmConfig(kv_transfer_config=config), KVConnectorRole.WORKER, None)


def test_each_arm_counts_its_own_calls_and_the_classes_are_restored(tmp_path):
    connector = worker(tmp_path)
    before = (vars(TracedConnector).get("wait_for_save"), vars(ExampleConnector)["wait_for_save"])
    times = HookTimes([connector])
    try:
        for arm, traced in (("traced", True), ("untraced", False), ("untraced", False)):
            set_traced([connector], traced)
            with times.around(arm):
                for _ in range(3):
                    connector.wait_for_save()
                    connector.get_block_ids_with_load_errors()
        set_traced([connector], True)
        connector.wait_for_save()  # outside a batch: not counted
    finally:
        times.restore()
    table = times.per_batch()
    traced, untraced = table["traced"], table["untraced"]
    assert traced["wait_for_save"]["calls"] == 3
    assert traced[INNER + "wait_for_save"]["calls"] == 3  # the wrapper called the wrapped one
    assert untraced[INNER + "wait_for_save"]["calls"] == 3  # per batch, over two batches
    assert "wait_for_save" not in untraced  # untraced, vLLM calls ExampleConnector itself
    assert traced["wait_for_save"]["us"] >= traced[INNER + "wait_for_save"]["us"] > 0
    assert "| wait_for_save | 3.0 |" in compare(table)
    after = (vars(TracedConnector).get("wait_for_save"), vars(ExampleConnector)["wait_for_save"])
    assert after == before
