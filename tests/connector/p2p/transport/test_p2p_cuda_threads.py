"""P2P's own threads (the progress poller, the handshake executor) set the KV cache's CUDA
device before they call NIXL, as vLLM's NIXL handshake thread does: UCX turns CUDA IPC off on a
thread without a CUDA context. Real NIXL agents over host memory; the binder is recorded."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")  # the puller's spans and metadata
pytest.importorskip("opentelemetry")

from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.metadata import BlockPull
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.connector.p2p.puller import BlockPuller
from kvscope.connector.p2p.transport import cuda_threads, nixl_agent, nixl_transport
from kvscope.harness.engine import free_port
from kvscope.harness.nixl_peer import FakeKVShape, make_fake_kv_caches

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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_vram_read_between_two_agents_handshaking_on_other_threads():
    """Two engines' transports in one process over GPU memory; the peer is added on a
    handshake thread (as BlockPuller does) and the read is progressed by the poller thread."""
    shape = FakeKVShape(num_layers=2, num_blocks=8)
    owner_kv = make_fake_kv_caches(shape, seed=5, device="cuda")
    reader_kv = make_fake_kv_caches(shape, seed=None, device="cuda")
    with (
        nixl_transport.NixlTransport("prefill", owner_kv) as owner,
        nixl_transport.NixlTransport("decode", reader_kv) as reader,
    ):
        info = owner.peer_info()
        added: list[str] = []

        def handshake() -> None:
            reader.bind_thread()
            added.append(reader.add_peer(info.agent_metadata, info.layout))

        thread = threading.Thread(target=handshake, name="kvscope-p2p-hs-test")
        thread.start()
        thread.join(timeout=60)
        (result,) = reader.wait([reader.read_blocks(added[0], [1, 6], [2, 3])], timeout_s=30)
    assert result.ok, result.cause
    for name, layer in reader_kv.items():
        got, want = layer[[2, 3]].view(torch.int16), owner_kv[name][[1, 6]].view(torch.int16)
        assert torch.equal(got, want), name
