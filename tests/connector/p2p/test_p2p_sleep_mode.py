"""vLLM 0.33's sleep mode: P2P says it follows it, and handshake metadata sent again (as vLLM
does at wake-up) makes its later leases name a new registration.

vLLM 0.33 asks the configured connector class `supports_sleep_mode(kv_transfer_config)` when
sleep mode is on and refuses to start on False (config/vllm.py). The class is found by vLLM's
own factory here; test_p2p_lends_kv_cache runs the hooks themselves.
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


def test_vllm_finds_a_p2p_connector_that_follows_sleep_mode(vllm_config):
    transfer_config = vllm_config.kv_transfer_config
    connector_class = KVConnectorFactory.get_connector_class(transfer_config)
    assert connector_class.__name__ == "P2PConnector"
    # What vLLM 0.33 runs (sleep mode on) before it builds any connector.
    assert connector_class.supports_sleep_mode(transfer_config) is True
    assert P2PCore.supports_sleep_mode(transfer_config) is True


def test_the_sleep_hooks_of_a_scheduler_half_do_nothing(vllm_config):
    connector = P2PCore(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config(("full",)))
    for hook in (connector.unregister_kv_caches, connector.restore_kv_caches):
        assert hook() is None


def test_handshake_metadata_sent_again_names_a_new_registration(vllm_config):
    connector_class = KVConnectorFactory.get_connector_class(vllm_config.kv_transfer_config)
    connector = connector_class(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config(("full",)))
    scheduler = connector.inner.scheduler
    metadata = {(0, 0): object(), (0, 1): object()}  # vLLM's (pp_rank, tp_rank) keys
    assert connector.set_xfer_handshake_metadata_pp_aware(metadata) is None  # at start
    assert scheduler.registration == 0
    for wake_ups in (1, 2):
        assert connector.set_xfer_handshake_metadata_pp_aware(metadata) is None
        assert scheduler.registration == wake_ups
    assert connector.reset_cache() is None  # nothing to clear, as vLLM's default says
    assert scheduler.registration == 3
    step = scheduler.build_metadata()
    assert step.reqs_to_recv == [] and step.registration == 3  # still serving
