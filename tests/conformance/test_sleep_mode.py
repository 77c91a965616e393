"""vLLM 0.33's sleep-mode API through TracedConnector and the Multi, harmless on 0.32: the
wrapped classes are asked, every child is told, a class written for 0.32 is left alone."""

from typing import Any

import pytest
from vllm.config.kv_transfer import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvscope.connector.multi.connector import KvscopeMultiConnector
from kvscope.connector.traced import TracedConnector
from kvscope.harness import configs
from kvscope.traces import names
from tests.conformance.recording import RECORDING
from tests.conformance.wrappers import vllm_config

MODULE = __name__
SLEEP_HOOKS = ("unregister_kv_caches", "restore_kv_caches")


class SleepsLike033(RECORDING["ExampleConnector"]):
    """A connector written for vLLM 0.33: says whether it follows sleep mode (extra config
    'sleeps'), and records the sleep hooks."""

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: KVTransferConfig) -> bool:
        return bool((kv_transfer_config.kv_connector_extra_config or {}).get("sleeps", True))

    def unregister_kv_caches(self) -> None:
        self.calls.append(("unregister_kv_caches", (), {}))

    def restore_kv_caches(self) -> None:
        self.calls.append(("restore_kv_caches", (), {}))

    def set_xfer_handshake_metadata(self, metadata) -> None:
        self.calls.append(("set_xfer_handshake_metadata", (metadata,), {}))


Written032 = RECORDING["ExampleConnector"]
"""A connector written for vLLM 0.32: no sleep-mode members at all."""


def child(name: str, sleeps: bool | None = None) -> dict[str, Any]:
    """A class of this module as a Multi's child; sleeps=None leaves its answer to the class."""
    extra = {} if sleeps is None else {"sleeps": sleeps}
    return configs.child(name, name, MODULE, **extra)


def traced_child(name: str, sleeps: bool | None = None) -> dict[str, Any]:
    extra = {} if sleeps is None else {"sleeps": sleeps}
    return configs.traced_child(name, connector_module_path=MODULE, **extra)


def traced_config(name: str, sleeps: bool | None = None) -> KVTransferConfig:
    return KVTransferConfig(**configs.engine_config(traced_child(name, sleeps)))


def multi_config(*children: dict) -> KVTransferConfig:
    return KVTransferConfig(**configs.multi_config(*children))


@pytest.mark.parametrize("sleeps", [True, False])
def test_traced_connector_says_what_the_wrapped_class_says(sleeps):
    assert TracedConnector.supports_sleep_mode(traced_config("SleepsLike033", sleeps)) is sleeps


def test_a_class_without_the_question_follows_vllms_default():
    assert TracedConnector.supports_sleep_mode(traced_config("Written032")) is True


def test_the_multi_follows_sleep_mode_only_when_every_child_does():
    ask = KvscopeMultiConnector.supports_sleep_mode
    assert ask(multi_config(child("SleepsLike033", True), child("Written032"))) is True
    assert ask(multi_config(child("SleepsLike033", True), child("SleepsLike033", False))) is False


def test_a_traced_child_is_asked_through_its_wrapper():
    traced = traced_child("SleepsLike033", sleeps=False)
    assert KvscopeMultiConnector.supports_sleep_mode(multi_config(traced)) is False


def test_sleep_and_wake_reach_the_wrapped_connector_traced(spans):
    connector = TracedConnector(
        vllm_config(traced_config("SleepsLike033")), KVConnectorRole.WORKER, None
    )
    for hook in SLEEP_HOOKS:
        getattr(connector, hook)()
    assert [call[0] for call in connector.inner.calls] == list(SLEEP_HOOKS)
    traced = [s.attributes[names.HOOK] for s in spans() if names.HOOK in s.attributes]
    assert traced == list(SLEEP_HOOKS)


def test_sleep_and_wake_reach_every_child_and_skip_a_032_one():
    config = multi_config(child("SleepsLike033"), child("Written032"), child("SleepsLike033"))
    connector = KvscopeMultiConnector(vllm_config(config), KVConnectorRole.WORKER, None)
    for hook in SLEEP_HOOKS:
        getattr(connector, hook)()
    calls = [[c[0] for c in child.connector.calls] for child in connector.inner.children]
    assert calls == [list(SLEEP_HOOKS), [], list(SLEEP_HOOKS)]


def test_a_032_connector_traced_sleeps_and_wakes_as_a_no_op(spans):
    connector = TracedConnector(
        vllm_config(traced_config("Written032")), KVConnectorRole.WORKER, None
    )
    for hook in SLEEP_HOOKS:
        getattr(connector, hook)()
    assert connector.inner.calls == []


@pytest.mark.parametrize("wrapper", ["traced", "multi"])
def test_handshake_metadata_sent_again_after_wake_reaches_the_connector_again(wrapper):
    """After wake-up vLLM 0.33 sends the workers' handshake metadata again."""
    if wrapper == "traced":
        connector = TracedConnector(
            vllm_config(traced_config("SleepsLike033")), KVConnectorRole.SCHEDULER, None
        )
        inner = connector.inner
    else:
        config = multi_config(child("SleepsLike033"))
        connector = KvscopeMultiConnector(vllm_config(config), KVConnectorRole.SCHEDULER, None)
        inner = connector.inner.children[0].connector
    first, second = {0: "before sleep"}, {0: "after wake"}
    connector.set_xfer_handshake_metadata(first)
    connector.unregister_kv_caches()
    connector.restore_kv_caches()
    connector.set_xfer_handshake_metadata(second)
    assert inner.calls_of("set_xfer_handshake_metadata") == [((first,), {}), ((second,), {})]
