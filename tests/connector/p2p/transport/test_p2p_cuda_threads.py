"""P2P's own threads (the progress poller, the handshake executor) set the KV cache's CUDA
device before they call NIXL, as vLLM's NIXL handshake thread does: UCX turns CUDA IPC off on a
thread without a CUDA context. Real NIXL agents over host memory; the binder is recorded."""

import os
import threading
import time
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")  # the puller's spans and metadata
pytest.importorskip("opentelemetry")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from kvscope.connector.p2p.config import P2PConfig  # noqa: E402
from kvscope.connector.p2p.metadata import BlockPull  # noqa: E402
from kvscope.connector.p2p.params import RemotePrefill  # noqa: E402
from kvscope.connector.p2p.puller import BlockPuller  # noqa: E402
from kvscope.connector.p2p.transport import cuda_threads, nixl_agent, nixl_transport  # noqa: E402
from kvscope.harness.engine import free_port  # noqa: E402
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches  # noqa: E402

try:
    nixl_agent.load_nixl_api()
except ImportError as exc:
    pytest.skip(f"no NIXL beside this torch: {exc}", allow_module_level=True)


def test_the_binder_sets_the_kv_caches_device_and_nothing_for_host_memory(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    cuda_threads.device_binder([SimpleNamespace(device=torch.device("cuda", 1))])()
    cuda_threads.device_binder([torch.zeros(1)])()
    assert calls == [1]
    with pytest.raises(ValueError, match="2 devices"):
        cuda_threads.device_binder(
            [SimpleNamespace(device=torch.device("cuda", i)) for i in (0, 1)]
        )


def test_the_poller_and_the_handshake_threads_bind_before_calling_nixl(monkeypatch):
    bound: list[str] = []

    def binder(kv_caches):
        return lambda: bound.append(threading.current_thread().name)

    monkeypatch.setattr(nixl_transport, "device_binder", binder)
    kv_caches = make_fake_kv_caches(FakeKVShape(num_layers=1, num_blocks=4), seed=None)
    with nixl_transport.NixlTransport("decode", kv_caches) as transport:
        puller = BlockPuller(transport, P2PConfig(handshake_timeout_s=0.5))
        remote = RemotePrefill(
            "prefill", "p-1", "127.0.0.1", free_port(), ((0,),), 32, 32, time.time() + 30, 1
        )
        puller.start([BlockPull("d-1", ((0,),), ((1,),), remote)], [])  # nobody listens there
        deadline = time.monotonic() + 10
        while not puller.poll() and time.monotonic() < deadline:
            time.sleep(0.01)
        puller.close()
    assert "kvscope-p2p-poller" in bound
    assert any(name.startswith("kvscope-p2p-hs") for name in bound), bound
