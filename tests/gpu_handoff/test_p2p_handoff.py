"""The P2P connector (untraced and traced) over every CUDA backend's hand-off, with real NIXL.

For each backend x model kind the builder produces, a prefill and a decode worker half register
the views a GPU worker hands them (P2P's layout preference resolved as on CUDA, kernel-block
views and KV-sharing aliases as vLLM makes them); the decode side READs scattered blocks: each
lands byte-exactly in every layer, every other block keeps its bytes, the prefill side hears the
read was done. KV-sharing layers are registered and moved once; MLA replicas under tensor
parallelism are read once per decode rank, from the prefill rank of its number.
"""

import os
import time
from unittest import mock

import pytest

pytest.importorskip("vllm")
os.environ.setdefault("UCX_NET_DEVICES", "lo")

import torch  # noqa: E402

from kvscope.connector.p2p.transport.nixl_agent import load_nixl_api  # noqa: E402

try:
    load_nixl_api()
except ImportError as exc:
    pytest.skip(f"no NIXL beside this torch: {exc}", allow_module_level=True)

from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from kvscope.connector.p2p import core as p2p_core  # noqa: E402
from kvscope.connector.p2p import vllm_layout  # noqa: E402
from kvscope.connector.p2p.metadata import BlockPull, HeldBlocks, P2PMetadata  # noqa: E402
from kvscope.connector.p2p.params import RemotePrefill  # noqa: E402
from kvscope.harness.engine import free_port  # noqa: E402
from tests.gpu_handoff.builder import HandOff, build_worker_kv_caches, handoff_cases  # noqa: E402

SENTINEL = 0xA5  # every decode block's byte before the read
NUM_BLOCKS = 8
LOCAL_IDS = ((1, 2), (4, 7))  # per KV cache group: scattered, never block 0 (vLLM's null block)
REMOTE_IDS = ((6, 3), (5, 2))  # read into LOCAL_IDS pairwise, in another order


def p2p_cases() -> list[tuple[str, str, int, str]]:
    """One case per backend x model kind: its largest block size (kernel-block views where the
    backend splits blocks), fp8 where it takes fp8 (stored as bytes), else the model's dtype."""
    chosen: dict[tuple[str, str], tuple[str, str, int, str]] = {}
    for case in handoff_cases():
        backend, kind, block_size, dtype = case
        best = chosen.get((backend, kind))
        if best is None or (block_size, dtype == "fp8") > (best[2], best[3] == "fp8"):
            chosen[(backend, kind)] = case
    return list(chosen.values())


def case_id(case: tuple) -> str:
    return "-".join(str(part) for part in case)


def p2p_transfer_config(setup: str, engine_id: str, port: int) -> KVTransferConfig:
    core = setup == "core"
    return KVTransferConfig(
        kv_connector="P2PCore" if core else "P2PConnector",
        kv_connector_module_path=f"kvscope.connector.p2p.{'core' if core else 'connector'}",
        kv_role="kv_both",
        engine_id=engine_id,
        kv_connector_extra_config={"side_channel_port": port, "lease_timeout_s": 30},
    )


class Side:
    """One engine's worker half over a GPU hand-off: its connector and its views."""

    def __init__(
        self, model, case, setup: str, engine_id: str, port: int | None = None, **build
    ) -> None:
        backend, kind, block_size, dtype = case
        self.port = port or free_port()  # the side channel port of its TP rank 0
        # On CUDA P2P asks vLLM for BLNHC (none for MLA models: vLLM then resolves its default,
        # LBNHC, and splits kernel blocks); on the CPU platform it asks for none.
        with mock.patch.object(vllm_layout, "_platform_is_cpu", lambda: kind == "mla"):
            self.handoff: HandOff = build_worker_kv_caches(
                backend,
                kind,
                block_size,
                dtype,
                num_blocks=NUM_BLOCKS,
                model=model,
                kv_transfer_config=p2p_transfer_config(setup, engine_id, self.port),
                **build,
            )
        self.connector = KVConnectorFactory.create_connector(
            self.handoff.vllm_config, KVConnectorRole.WORKER, self.handoff.kv_cache_config
        )
        self.connector.register_kv_caches(self.handoff.kv_caches)

    @property
    def groups(self) -> int:
        return len(self.handoff.kv_cache_config.kv_cache_groups)

    @property
    def worker(self):
        connector = self.connector
        return getattr(connector, "inner", connector).worker

    def fill(self, seed: int | None) -> None:
        """Every byte random (seeded), or SENTINEL."""
        generator = torch.Generator().manual_seed(seed or 0)
        for view in self.handoff.kv_caches.values():
            raw = view.view(torch.uint8)
            if seed is None:
                raw.fill_(SENTINEL)
            else:
                raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))

    def step(self, metadata: P2PMetadata) -> tuple[set[str], set[str]]:
        """One engine step's P2P hooks: (finished_sending, finished_recving)."""
        self.connector.bind_connector_metadata(metadata)
        self.connector.start_load_kv(None)
        sending, recving = self.connector.get_finished(set())
        self.connector.clear_connector_metadata()
        return sending or set(), recving or set()

    def close(self) -> None:
        self.connector.shutdown()


def lend_and_pull(prefill: Side, decode: Side, timeout_s: float = 20.0) -> dict[int, int]:
    """The prefill side holds REMOTE_IDS, the decode side reads them into LOCAL_IDS; steps both
    until the read ended and the prefill side heard of it. Returns local -> remote block id."""
    groups = prefill.groups
    remote, local = REMOTE_IDS[:groups], LOCAL_IDS[:groups]
    deadline = time.time() + 30
    block_size = prefill.handoff.block_size
    held = RemotePrefill(
        prefill.handoff.vllm_config.kv_transfer_config.engine_id,
        "p-req",
        "127.0.0.1",
        prefill.port,
        remote,
        2 * block_size,
        block_size,
        deadline,
        2,
    )
    to_send = P2PMetadata(reqs_to_send=[HeldBlocks("p-req", remote, deadline)])
    to_recv = P2PMetadata(reqs_to_recv=[BlockPull("d-req", local, remote, held)])
    sent, received = prefill.step(to_send)[0], decode.step(to_recv)[1]
    started = time.monotonic()
    while "p-req" not in sent or "d-req" not in received:
        assert time.monotonic() - started < timeout_s, (sent, received)
        time.sleep(0.005)
        sent |= prefill.step(P2PMetadata())[0]
        received |= decode.step(P2PMetadata())[1]
    return {
        lid: rid
        for lg, rg in zip(local, remote, strict=True)
        for lid, rid in zip(lg, rg, strict=True)
    }


def assert_read_exactly(prefill: Side, decode: Side, moved: dict[int, int]) -> None:
    """A read moves whole blocks of every KV memory: each local block of `moved` holds the
    prefill side's block in every layer (aliases and overlaid groups included), others SENTINEL."""
    for layer_name in decode.handoff.kv_caches:
        for block_id in range(NUM_BLOCKS):
            got = decode.handoff.block_bytes(layer_name, block_id)
            if block_id in moved:
                want = prefill.handoff.block_bytes(layer_name, moved[block_id])
                assert got.equal(want), (layer_name, block_id, "not the prefill side's bytes")
            else:
                assert bool((got == SENTINEL).all()), (layer_name, block_id, "was written")


def pair(model, case, setup: str, **build) -> tuple[Side, Side]:
    prefill = Side(model, case, setup, "prefill", **build)
    decode = Side(model, case, setup, "decode", **build)
    prefill.fill(seed=1)
    decode.fill(seed=None)
    return prefill, decode


def setup_cases() -> list[tuple[tuple[str, str, int, str], str]]:
    """Every case untraced; traced (the same bytes through the instrumentation) once per kind,
    as each NIXL pair costs a second of set-up on two cores."""
    cases = p2p_cases()
    first_of_kind = {case[1]: case for case in reversed(cases)}
    return [(case, "core") for case in cases] + [
        (case, "traced") for case in first_of_kind.values()
    ]


@pytest.mark.parametrize(
    ("case", "setup"), setup_cases(), ids=lambda v: v if isinstance(v, str) else case_id(v)
)
def test_blocks_read_byte_exactly_through_the_gpu_views(tiny_model, case, setup):
    prefill, decode = pair(tiny_model, case, setup)
    try:
        moved = lend_and_pull(prefill, decode)
        assert_read_exactly(prefill, decode, moved)
        assert decode.worker.take_failed_loads() == set()
    finally:
        prefill.close()
        decode.close()


def test_kernel_block_views_are_read_as_whole_kv_blocks(tiny_model):
    """FlashMLA's kernel takes 64-token blocks: vLLM hands views with 2 rows per 128-token block."""
    prefill, decode = pair(tiny_model, ("FLASHMLA", "mla", 128, "auto"), "core")
    try:
        assert decode.handoff.layout == "LBNHC" and decode.handoff.blocks_per_kv_block == 2
        assert decode.worker.transport.layout.num_blocks == NUM_BLOCKS
        assert_read_exactly(prefill, decode, lend_and_pull(prefill, decode))
    finally:
        prefill.close()
        decode.close()


def test_kv_sharing_layers_are_registered_and_read_once(tiny_model):
    """vLLM aliases a KV-sharing layer into the dict under a second name after the connector
    was built: its bytes are the target's and move with them, once."""
    case = ("FLASH_ATTN", "full", 64, "auto")
    prefill, decode = pair(tiny_model, case, "core", num_shared_layers=1)
    try:
        assert len(decode.handoff.kv_caches) == 3 and decode.handoff.shared_layers
        layout = decode.worker.transport.layout
        assert layout.num_layers == 2, "a KV-sharing alias was registered as a layer of its own"
        assert decode.handoff.layout == "BLNHC" and layout.block_runs  # one run per block
        moved = lend_and_pull(prefill, decode)
        assert_read_exactly(prefill, decode, moved)  # the alias's view shows the read too
        page_bytes = decode.handoff.block_bytes(next(iter(decode.handoff.kv_caches)), 0).numel()
        assert decode.worker.puller.stats["read_bytes"] == len(moved) * 2 * page_bytes
    finally:
        prefill.close()
        decode.close()


def test_mla_replicas_are_read_once_per_decode_rank_from_its_own_prefill_rank(
    tiny_model, monkeypatch
):
    """MLA stores the same KV on every TP rank (KVCacheConfig.kv_tp_replicas): each decode rank
    reads its copy from the prefill rank of its number, once; no rank reads another's."""
    case = ("FLASHMLA", "mla", 64, "auto")
    base_ports = {"prefill": free_port(), "decode": free_port()}
    sides: dict[tuple[str, int], Side] = {}
    try:
        for rank in (0, 1):
            monkeypatch.setattr(p2p_core, "_tp_rank", lambda tp_size, rank=rank: rank)
            for role, seed in (("prefill", 10 + rank), ("decode", None)):
                side = Side(
                    tiny_model, case, "core", role, base_ports[role], tensor_parallel_size=2
                )
                side.fill(seed)
                sides[(role, rank)] = side
        assert sides[("decode", 0)].handoff.kv_cache_config.kv_tp_replicas == 2
        for rank in (0, 1):
            prefill, decode = sides[("prefill", rank)], sides[("decode", rank)]
            moved = lend_and_pull(prefill, decode)
            assert_read_exactly(prefill, decode, moved)  # rank 0's seed differs from rank 1's
            page_bytes = prefill.handoff.block_bytes(next(iter(prefill.handoff.kv_caches)), 0)
            assert decode.worker.puller.stats["reads"] == 1
            assert decode.worker.puller.stats["read_bytes"] == len(moved) * 2 * page_bytes.numel()
        for rank in (0, 1):
            assert sides[("prefill", rank)].worker.lender.stats["reads_notified"] == 1
    finally:
        for side in sides.values():
            side.close()


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
