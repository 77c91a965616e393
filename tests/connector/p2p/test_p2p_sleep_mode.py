"""vLLM 0.33's sleep mode: P2P says it cannot follow it, and repeated handshake metadata is fine.

vLLM 0.33 asks the configured connector class `supports_sleep_mode(kv_transfer_config)` when
sleep mode is on and refuses to start on False (config/vllm.py); sleep frees and remaps the KV
cache, which P2P's peers would keep reading. The class is found by vLLM's own factory here.
"""

import pytest

pytest.importorskip("vllm")
pytest.importorskip("opentelemetry")

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from kvscope.connector.p2p.core import P2PCore  # noqa: E402
from tests.connector.cpu_offload.hma_harness import kv_cache_config  # noqa: E402
from tests.connector.p2p.hma_pair import p2p_vllm_config  # noqa: E402


@pytest.fixture(scope="module")
def vllm_config(tiny_model):
    return p2p_vllm_config(tiny_model, "sleepy", 5997, "recompute")


def test_vllm_finds_a_p2p_connector_that_refuses_sleep_mode(vllm_config):
    transfer_config = vllm_config.kv_transfer_config
    connector_class = KVConnectorFactory.get_connector_class(transfer_config)
    assert connector_class.__name__ == "P2PConnector"
    # What vLLM 0.33 runs (sleep mode on) before it builds any connector.
    assert connector_class.supports_sleep_mode(transfer_config) is False
    assert P2PCore.supports_sleep_mode(transfer_config) is False


def test_a_sleep_hook_that_reaches_p2p_anyway_says_how_to_start(vllm_config):
    connector = P2PCore(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config(("full",)))
    for hook in (connector.unregister_kv_caches, connector.restore_kv_caches):
        with pytest.raises(RuntimeError, match="without --enable-sleep-mode"):
            hook()


def test_handshake_metadata_sent_again_after_wake_up_is_accepted(vllm_config):
    connector_class = KVConnectorFactory.get_connector_class(vllm_config.kv_transfer_config)
    connector = connector_class(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config(("full",)))
    metadata = {(0, 0): object(), (0, 1): object()}  # vLLM's (pp_rank, tp_rank) keys
    for _ in range(3):
        assert connector.set_xfer_handshake_metadata_pp_aware(metadata) is None
        assert connector.set_xfer_handshake_metadata({0: object()}) is None
    assert connector.inner.scheduler.build_metadata().reqs_to_recv == []  # still serving
