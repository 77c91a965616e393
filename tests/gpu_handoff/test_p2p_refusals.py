"""P2P refuses hand-offs it cannot read byte-exactly, naming the setting to change.

Unreadable views fail at start; a peer of other pages or MLA TP size fails the pull (recomputed)."""

import os
import time

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

from kvscope.connector.p2p.transport.nixl_agent import load_nixl_api  # noqa: E402

try:
    load_nixl_api()
except ImportError as exc:
    pytest.skip(f"no NIXL beside this torch: {exc}", allow_module_level=True)

from kvscope.connector.p2p import core as p2p_core  # noqa: E402
from kvscope.connector.p2p.metadata import BlockPull, P2PMetadata  # noqa: E402
from kvscope.connector.p2p.params import RemotePrefill  # noqa: E402
from tests.gpu_handoff.p2p_pair import LOCAL_IDS, REMOTE_IDS, Side  # noqa: E402


def test_views_p2p_cannot_read_are_refused_at_start_naming_the_layout_to_set(tiny_model):
    """LHBNC keeps neither a block nor a layer's page in one run of bytes."""
    with pytest.raises(ValueError, match="VLLM_KV_CACHE_LAYOUT to one of LBHNC"):
        Side(tiny_model, ("FLASH_ATTN", "full", 64, "auto"), "core", "lhbnc", layout="LHBNC")


def test_sides_whose_pages_differ_fail_the_pull_naming_the_layout_to_set(tiny_model):
    """LBHNC pages are heads-outer, BLNHC's tokens-outer: no run of bytes means the same on
    both sides, so the handshake refuses the peer and the request is recomputed."""
    case = ("FLASH_ATTN", "full", 64, "auto")
    prefill = Side(tiny_model, case, "core", "prefill", layout="LBHNC")
    decode = Side(tiny_model, case, "core", "decode")
    try:
        assert decode.handoff.layout == "BLNHC"
        held = RemotePrefill(
            "prefill",
            "p-req",
            "127.0.0.1",
            prefill.port,
            REMOTE_IDS[:1],
            128,
            64,
            time.time() + 30,
            2,
        )
        pull = BlockPull("d-req", LOCAL_IDS[:1], REMOTE_IDS[:1], held)
        received = decode.step(P2PMetadata(reqs_to_recv=[pull]))[1]
        started = time.monotonic()
        while "d-req" not in received:  # a failed pull ends too: vLLM then recomputes it
            assert time.monotonic() - started < 10
            time.sleep(0.005)
            received = decode.step(P2PMetadata())[1]
        assert decode.connector.get_block_ids_with_load_errors() == set(LOCAL_IDS[0])
        cause = decode.worker.take_worker_meta().loads_failed["d-req"]
        assert "handshake failed" in cause and "set VLLM_KV_CACHE_LAYOUT" in cause
    finally:
        prefill.close()
        decode.close()


def test_mla_sides_of_different_tp_sizes_fail_the_pull_naming_the_tp_size(tiny_model, monkeypatch):
    """Replicated MLA KV could be read from any prefill rank, but the prefill ranks each hold
    the blocks until their own reader notifies: P2P trades only between equal TP sizes."""
    case = ("FLASHMLA", "mla", 64, "auto")
    prefill = Side(tiny_model, case, "core", "prefill")
    monkeypatch.setattr(p2p_core, "_tp_rank", lambda tp_size: 0)
    decode = Side(tiny_model, case, "core", "decode", tensor_parallel_size=2)
    try:
        held = RemotePrefill(
            "prefill",
            "p-req",
            "127.0.0.1",
            prefill.port,
            REMOTE_IDS[:1],
            128,
            64,
            time.time() + 30,
            2,
        )
        decode.step(
            P2PMetadata(reqs_to_recv=[BlockPull("d-req", LOCAL_IDS[:1], REMOTE_IDS[:1], held)])
        )
        started = time.monotonic()
        while not decode.worker.puller.loads_failed:
            assert time.monotonic() - started < 10
            time.sleep(0.005)
            decode.step(P2PMetadata())
        cause = decode.worker.take_worker_meta().loads_failed["d-req"]
        assert "tp_size: local 2, remote 1 (use the same tensor-parallel size)" in cause
    finally:
        prefill.close()
        decode.close()
