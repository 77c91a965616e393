"""harness/configs.py's configs, read by vLLM's own KVTransferConfig and connector factory and by
the connectors' own parsers: a key vLLM or a connector does not know fails here."""

from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.connector import CpuOffloadConnector
from kvscope.connector.cpu_offload.faults import FaultInjector
from kvscope.connector.multi.children import child_configs, configured_class, transfer_config
from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.connector import P2PConnector
from kvscope.connector.traced import TracedConnector
from kvscope.harness import configs


def vllm_reads(config: dict) -> KVTransferConfig:
    """The config as vLLM's engine arguments take it (pydantic refuses an unknown field)."""
    return KVTransferConfig(**config)


def test_the_offload_config_names_the_class_vllm_loads_and_its_settings():
    transfer = vllm_reads(configs.offload_config("fail", load_timeout_s=1.5))
    assert KVConnectorFactory.get_connector_class(transfer) is CpuOffloadConnector
    assert transfer.kv_role == "kv_both" and transfer.kv_load_failure_policy == "fail"
    offload = OffloadConfig.from_extra_config(transfer.kv_connector_extra_config)
    assert offload.cpu_bytes_to_use == configs.OFFLOAD_BYTES and offload.load_timeout_s == 1.5


def test_the_p2p_config_gets_a_free_side_channel_port_unless_given_one():
    transfer = vllm_reads(configs.p2p_config(read_timeout_s=3.0))
    assert KVConnectorFactory.get_connector_class(transfer) is P2PConnector
    p2p = P2PConfig.from_extra_config(transfer.kv_connector_extra_config)
    assert p2p.read_timeout_s == 3.0 and p2p.side_channel_port > 0
    given = vllm_reads(configs.p2p_config(side_channel_port=6123)).kv_connector_extra_config
    assert P2PConfig.from_extra_config(given).side_channel_port == 6123


def test_a_traced_child_wraps_the_vllm_connector_it_names():
    transfer = vllm_reads(
        configs.engine_config(configs.traced_child("ExampleConnector", shared_storage_path="/s"))
    )
    assert KVConnectorFactory.get_connector_class(transfer) is TracedConnector
    extra = transfer.kv_connector_extra_config
    assert TracedConnector.inner_class(extra) is ExampleConnector
    assert TracedConnector.inner_extra_config(extra) == {"shared_storage_path": "/s"}


def test_a_multis_children_pass_its_own_child_checks_in_order(tmp_path):
    faults = tmp_path / "faults.json"
    faults.write_text('{"fail_load_every": 3}')
    config = configs.multi_config(
        configs.p2p_child(),
        configs.offload_child(faults_path=str(faults)),
        configs.traced_child("ExampleConnector", shared_storage_path=str(tmp_path)),
        policy="fail",
    )
    outer = vllm_reads(config)
    assert KVConnectorFactory.get_connector_class(outer) is KvscopeMultiConnector
    children = child_configs(outer.kv_connector_extra_config, outer.kv_role)
    assert [child["name"] for child in children] == ["p2p", "offload", "traced"]
    classes = [configured_class(child, outer) for child in children]
    assert classes == [P2PConnector, CpuOffloadConnector, TracedConnector]
    offload = transfer_config(children[1], outer)
    assert offload.kv_load_failure_policy == "fail"  # inherited from the Multi
    injector = FaultInjector.from_extra_config(offload.kv_connector_extra_config)
    assert injector.plan.fail_load_every == 3  # read from the file the child names


def test_the_demo_config_serves_p2p_first_then_offload_with_the_extra_given(tmp_path):
    children = configs.demo_children(5701, tmp_path / "faults.json", lease_timeout_s=7.0)
    outer = vllm_reads(configs.multi_config(*children))
    p2p, offload = child_configs(outer.kv_connector_extra_config, outer.kv_role)
    p2p_extra = transfer_config(p2p, outer).kv_connector_extra_config
    assert P2PConfig.from_extra_config(p2p_extra).side_channel_port == 5701
    parsed = OffloadConfig.from_extra_config(
        transfer_config(offload, outer).kv_connector_extra_config
    )
    assert parsed.load_timeout_s == 0.5 and parsed.lease_timeout_s == 7.0
    assert configs.demo_config(5701, tmp_path / "faults.json") == configs.multi_config(
        *configs.demo_children(5701, tmp_path / "faults.json")
    )


def test_a_childs_own_keys_never_collide_with_the_builders_arguments():
    built = configs.child("x", "SomeConnector", None, name="inner", connector="C", module="m")
    assert built["name"] == "x" and built["kv_connector"] == "SomeConnector"
    assert built["kv_connector_extra_config"] == {"name": "inner", "connector": "C", "module": "m"}
    assert "kv_connector_module_path" not in built


def test_registered_builders_name_each_connector_by_its_registered_name_alone():
    from kvscope.connector.plugin import CONNECTORS, register

    register()  # what vLLM's general plugins do in an engine
    built = {
        "KvscopeCpuOffloadConnector": configs.offload_config(registered=True),
        "KvscopeP2PConnector": configs.p2p_config(registered=True),
        "KvscopeMultiConnector": configs.multi_config(configs.offload_child(), registered=True),
        "KvscopeTracedConnector": configs.engine_config(
            configs.traced_child("ExampleConnector", registered=True)
        ),
    }
    assert set(built) == set(CONNECTORS)
    for name, config in built.items():
        transfer = vllm_reads(config)
        assert transfer.kv_connector == name and transfer.kv_connector_module_path is None
        cls = KVConnectorFactory.get_connector_class(transfer)
        assert (cls.__module__, cls.__name__) == CONNECTORS[name]
    assert configs.offload_config() == {
        **configs.offload_config(registered=True),
        "kv_connector": configs.OFFLOAD_CLASS,
        "kv_connector_module_path": configs.OFFLOAD_MODULE,
    }
