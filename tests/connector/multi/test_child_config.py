"""A Multi child's config (no engine): vLLM's MultiConnector format, roles, refusals."""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiConnector

from kvscope.connector.child_config import TRANSFER_FIELDS
from kvscope.connector.cpu_offload.core import CpuOffloadCore
from kvscope.connector.multi.children import child_class, child_configs, transfer_config
from kvscope.connector.multi.core import MultiCore
from tests.vllm_release import on_cpu_platform

OFFLOAD = "kvscope.connector.cpu_offload.connector"
# A value for every KVTransferConfig field, none of them its default.
EVERY_FIELD = {
    "kv_connector": "CpuOffloadConnector",
    "kv_connector_module_path": OFFLOAD,
    "engine_id": "child-engine",
    "kv_buffer_device": "cpu",
    "kv_role": "kv_producer",
    "kv_port": 15123,
    "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20},
    "enable_permute_local_kv": True,
    "kv_load_failure_policy": "recompute",
}
NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


def outer(*children: dict, role: str = "kv_producer", **fields) -> KVTransferConfig:
    return KVTransferConfig(
        kv_connector="KvscopeMultiConnector",
        kv_connector_module_path="kvscope.connector.multi.connector",
        kv_role=role,
        engine_id="multi-engine",
        kv_load_failure_policy="fail",
        kv_connector_extra_config={"connectors": list(children)},
        **fields,
    )


def parsed(config: KVTransferConfig) -> list[KVTransferConfig]:
    configs = child_configs(config.kv_connector_extra_config, config.kv_role)
    return [transfer_config(child, config) for child in configs]


def test_the_sample_sets_every_kv_transfer_config_field():
    # A new KVTransferConfig field in vLLM shows up here first.
    assert set(EVERY_FIELD) == TRANSFER_FIELDS


def test_a_child_may_set_every_kv_transfer_config_field():
    (child,) = parsed(outer(EVERY_FIELD))
    assert dataclasses.asdict(child) == EVERY_FIELD


def test_a_child_in_vllm_format_gets_what_vllms_multiconnector_gives_it():
    # Not engine_id: vLLM's MultiConnector passes it twice and fails with a TypeError.
    every_but_engine_id = {k: v for k, v in EVERY_FIELD.items() if k != "engine_id"}
    config = outer(every_but_engine_id, {**NIXL, "kv_role": "kv_producer"})
    ours = parsed(config)
    theirs = MultiConnector._get_connector_classes_and_configs(
        SimpleNamespace(kv_transfer_config=config)
    )
    assert [dataclasses.asdict(c) for c in ours] == [
        dataclasses.asdict(vllm_config.kv_transfer_config) for _, vllm_config in theirs
    ]
    classes = [child_class(c, config) for c in child_configs(config.kv_connector_extra_config)]
    # kvscope's traced connectors are built untraced: the Multi traces its children itself.
    assert classes == [CpuOffloadCore, theirs[1][0]]


def test_fields_a_child_leaves_out_are_the_multis():
    (child,) = parsed(outer({"kv_connector": "NixlConnector"}, kv_buffer_device="cpu"))
    assert (child.kv_role, child.engine_id, child.kv_buffer_device) == (
        "kv_producer",
        "multi-engine",
        "cpu",
    )
    assert child.kv_load_failure_policy == "fail"


def test_a_child_with_another_kv_role_is_refused_with_what_to_do():
    with pytest.raises(ValueError) as refused:
        parsed(outer({**NIXL, "name": "nixl", "kv_role": "kv_consumer"}))
    message = str(refused.value)
    assert "child 0 (nixl)" in message
    assert (
        "kv_role 'kv_consumer' differs from the KvscopeMultiConnector's kv_role 'kv_producer'"
        in message
    )
    assert "leave it out" in message


@pytest.mark.parametrize("outer_role", ["kv_producer", "kv_consumer"])
def test_a_kv_both_child_fits_either_side_as_in_vllms_multi_connector(outer_role):
    config = KVTransferConfig(
        kv_connector="KvscopeMultiConnector",
        kv_role=outer_role,
        kv_connector_extra_config={"connectors": [{**NIXL, "kv_role": "kv_both"}]},
    )
    (child,) = child_configs(config.kv_connector_extra_config, outer_role)
    assert child["kv_role"] == "kv_both"


def test_unknown_keys_are_refused_naming_them_and_the_accepted_ones():
    with pytest.raises(ValueError) as refused:
        parsed(outer({"kv_connector": "NixlConnector", "kv_rol": "kv_both", "size": 1}))
    message = str(refused.value)
    assert "child 0 (NixlConnector): unknown keys ['kv_rol', 'size']" in message
    assert "'kv_role'" in message and "'name'" in message


@pytest.mark.parametrize(
    ("child", "says"),
    [
        ({"kv_role": "kv_both"}, "needs kv_connector"),
        ("NixlConnector", "a child is a dict"),
        ({"kv_connector": "NixlConnector", "kv_port": "abc"}, "child NixlConnector: 1 validation"),
        (
            {"kv_connector": "NixlConnector", "kv_load_failure_policy": "retry"},
            "kv_load_failure_policy",
        ),
    ],
)
def test_a_malformed_child_is_refused_clearly(child, says):
    with pytest.raises(ValueError, match=says):
        parsed(outer(child))


def test_a_field_given_as_none_is_inherited():
    (child,) = parsed(outer({**NIXL, "kv_role": None, "engine_id": None}))
    assert (child.kv_role, child.engine_id) == ("kv_producer", "multi-engine")


def test_children_of_one_class_get_distinct_names():
    config = outer(NIXL, NIXL, {**NIXL, "name": "mine"}, role="kv_both")
    names = [c["name"] for c in child_configs(config.kv_connector_extra_config)]
    assert names == ["NixlConnector", "NixlConnector#1", "mine"]


@on_cpu_platform
def test_the_kv_cache_layout_comes_from_each_childs_own_config():
    """vLLM asks the class before building anything; NixlConnector wants LBHNC."""
    offload = {"kv_connector": "CpuOffloadConnector", "kv_connector_module_path": OFFLOAD}
    config = outer(offload, NIXL, role="kv_both")
    vllm_config = SimpleNamespace(
        kv_transfer_config=config, model_config=SimpleNamespace(use_mla=False)
    )
    assert MultiCore.get_required_kvcache_layout(copy.copy(vllm_config)) == "LBHNC"
    assert CpuOffloadCore.get_required_kvcache_layout(vllm_config) is None
