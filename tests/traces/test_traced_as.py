"""A connector traced under its own name (connector/traced_as.py): vLLM's questions to the class
get the connector's own answers, and a real CPU engine runs it as it runs the connector bare.

vLLM decides from the class, before any connector exists, whether the hybrid KV cache manager
stays on (`KVConnectorFactory.supports_hma_config`, which for the name "MultiConnector" asks the
children). TracedConnector is SupportsHMA whatever it wraps; traced_as's classes are SupportsHMA
exactly when their connector is, so vLLM turns the manager off for a traced connector exactly
when it would bare, and refuses the same configurations.
"""

import pickle

import pytest
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from kvscope.connector.traced import TracedBase
from kvscope.connector.traced_as import traced_class
from kvscope.harness.engine import in_process_llm
from kvscope.harness.oracle import greedy_tokens
from kvscope.harness.prompts import DISTINCT
from kvscope.traces import names

TRACED_AS = "kvscope.connector.traced_as"


def stock_names() -> list[str]:
    """vLLM's registered connectors whose modules import here."""
    found = []
    for name in sorted(KVConnectorFactory._registry):
        try:
            KVConnectorFactory.get_connector_class_by_name(name)
        except Exception:
            continue
        if not name.startswith("Kvscope"):
            found.append(name)
    return found


def config(name: str, traced: bool, extra: dict | None = None) -> KVTransferConfig:
    module = {"kv_connector_module_path": TRACED_AS} if traced else {}
    return KVTransferConfig(
        kv_connector=name, kv_role="kv_both", kv_connector_extra_config=extra or {}, **module
    )


def multi_extra(*children: str) -> dict:
    return {"connectors": [{"kv_connector": child, "kv_role": "kv_both"} for child in children]}


@pytest.mark.parametrize("name", stock_names())
def test_vllm_keeps_the_hybrid_kv_cache_manager_exactly_when_it_would_bare(name):
    extra = multi_extra("NixlConnector") if name == "MultiConnector" else {}
    bare = KVConnectorFactory.supports_hma_config(config(name, False, extra))
    assert KVConnectorFactory.supports_hma_config(config(name, True, extra)) is bare
    cls = KVConnectorFactory.get_connector_class(config(name, True, extra))
    assert issubclass(cls, TracedBase) and cls.wrapped_name == name
    assert pickle.loads(pickle.dumps(cls)) is cls, "found again by name in every process"


@pytest.mark.parametrize(
    ("children", "supported"),
    [
        (("NixlConnector", "OffloadingConnector"), True),
        (("NixlConnector", "ExampleConnector"), False),
    ],
)
def test_a_traced_multi_connector_is_asked_about_its_children(children, supported):
    traced = config("MultiConnector", True, multi_extra(*children))
    assert KVConnectorFactory.supports_hma_config(traced) is supported


def test_a_class_of_your_own_module_is_named_with_its_module():
    cls = KVConnectorFactory.get_connector_class(
        config("tests.conformance.recording.RecordingNixlConnector", True)
    )
    assert cls.__name__ == "TracedRecordingNixlConnector" and cls.inner_class({}).__name__ == (
        "RecordingNixlConnector"
    )
    assert pickle.loads(pickle.dumps(cls)) is cls


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("NoSuchConnector", "Unsupported connector type"),
        ("kvscope.connector.traced.TracedConnector", "traced already"),
        (f"{TRACED_AS}.NixlConnector", "cannot trace its own"),
    ],
)
def test_what_cannot_be_traced_says_why(name, message):
    traced_class.cache_clear()
    with pytest.raises((ValueError, AttributeError), match=message):
        KVConnectorFactory.get_connector_class(config(name, True))


@pytest.mark.engine
def test_a_real_engine_runs_a_connector_traced_as_itself(tiny_model, tmp_path, span_exporter):
    from kvscope.traces.sdk.configure import flush

    with in_process_llm(tiny_model) as llm:
        expected = greedy_tokens(llm, DISTINCT)
    example = {
        "kv_connector": "ExampleConnector",
        "kv_connector_module_path": TRACED_AS,
        "kv_role": "kv_both",
        "kv_load_failure_policy": "fail",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    span_exporter.clear()
    with in_process_llm(tiny_model, example) as llm:
        first = greedy_tokens(llm, DISTINCT)
        llm.reset_prefix_cache()
        second = greedy_tokens(llm, DISTINCT)
        flush()
    assert first == expected and second == expected
    spans = span_exporter.get_finished_spans()
    hooks = {span.name for span in spans if span.name.startswith(names.SPAN_HOOK_PREFIX)}
    assert names.SPAN_HOOK_PREFIX + "start_load_kv" in hooks
    assert any(span.attributes.get(names.CONNECTOR_NAME) == "ExampleConnector" for span in spans)
