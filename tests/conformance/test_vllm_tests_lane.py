"""The lane of vLLM's own tests (scripts/vllm_tests): its rewrites are configs a user would write,
loaded by vLLM's factory as the wrapper over the same connector, and its comparison fails on a
test that passes bare and fails wrapped unless known.py lists it."""

import sys
from pathlib import Path

import pytest
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.traced_as import TracedAs

LANE = Path(__file__).resolve().parents[2] / "scripts" / "vllm_tests"
sys.path.insert(0, str(LANE))

import compare  # noqa: E402
import kvscope_wrap  # noqa: E402
import redirect  # noqa: E402

OFFLOAD = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"cpu_bytes_to_use": 1 << 20},
}


def test_traced_is_the_same_connector_under_traced_as():
    config = KVTransferConfig(**kvscope_wrap.traced(OFFLOAD))
    cls = KVConnectorFactory.get_connector_class(config)
    assert issubclass(cls, TracedAs) and cls.wrapped_name == "OffloadingConnector"
    assert config.kv_connector == "OffloadingConnector"  # vLLM's name checks still see it
    assert config.kv_connector_extra_config == OFFLOAD["kv_connector_extra_config"]
    assert kvscope_wrap.traced(kvscope_wrap.traced(OFFLOAD)) == kvscope_wrap.traced(OFFLOAD)


def test_multi_is_kvscopes_multi_with_the_connector_as_its_child():
    config = KVTransferConfig(**kvscope_wrap.multi(OFFLOAD))
    assert KVConnectorFactory.get_connector_class(config) is KvscopeMultiConnector
    assert config.has_connector("OffloadingConnector")
    (child,) = config.kv_connector_extra_config["connectors"]
    assert child["kv_connector_extra_config"] == OFFLOAD["kv_connector_extra_config"]
    vllms = {**OFFLOAD, "kv_connector": "MultiConnector", "kv_connector_extra_config": {}}
    assert kvscope_wrap.multi(vllms)["kv_connector_module_path"] == kvscope_wrap.MULTI


def junit(tmp_path: Path, name: str, outcomes: dict[str, str]) -> Path:
    cases = []
    for test, outcome in outcomes.items():
        module, function = test.split("::")
        inner = "" if outcome == "passed" else f"<{outcome} message='x'/>"
        cases.append(f"<testcase classname='{module}' name='{function}'>{inner}</testcase>")
    path = tmp_path / f"{name}.xml"
    path.write_text(f"<testsuites><testsuite>{''.join(cases)}</testsuite></testsuites>")
    return path


@pytest.mark.parametrize("wrap", ["traced", "multi"])
def test_a_test_that_passes_bare_and_fails_wrapped_fails_the_lane_unless_listed(
    tmp_path, monkeypatch, wrap
):
    bare = {"tests.a::test_x": "passed", "tests.a::test_y": "passed", "tests.a::test_z": "failure"}
    wrapped = {**bare, "tests.a::test_y": "failure"}
    paths = [junit(tmp_path, "bare", bare), junit(tmp_path, wrap, wrapped)]
    monkeypatch.setattr(compare, "KNOWN", {})
    assert compare.main([*map(str, paths), wrap]) == 1
    monkeypatch.setattr(compare, "KNOWN", {"tests.a::test_y": ((wrap,), "why")})
    assert compare.main([*map(str, paths), wrap]) == 0
    other = "multi" if wrap == "traced" else "traced"
    monkeypatch.setattr(compare, "KNOWN", {"tests.a::test_y": ((other,), "why")})
    assert compare.main([*map(str, paths), wrap]) == 1


def test_every_known_entry_has_a_wrap_and_a_reason():
    for pattern, (wraps, reason) in compare.KNOWN.items():
        assert wraps and set(wraps) <= set(kvscope_wrap.WRAPS), pattern
        assert len(reason) > 40, pattern


def test_the_committed_model_configs_redirect_by_their_hub_names():
    found = redirect.redirects(LANE / "hub")
    assert "facebook/opt-125m" in found
    assert all(Path(folder, "config.json").is_file() for folder in found.values())
