"""Two P2P worker halves over a GPU hand-off, stepped by hand: a prefill side lends, a decode reads.

Import it once NIXL is known to load (the test modules skip first); views as build_worker_kv_caches
makes them, P2P's layout preference resolved as on CUDA."""

import functools
import time
from collections.abc import Callable
from unittest import mock

import torch
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvscope.connector.p2p import vllm_layout
from kvscope.connector.p2p.metadata import BlockPull, HeldBlocks, P2PMetadata
from kvscope.connector.p2p.params import RemotePrefill
from kvscope.harness.engine import free_port
from tests.gpu_handoff.builder import (
    HandOff,
    build_worker_kv_caches,
    case_id,
    one_case_per_kind,
)

SENTINEL = 0xA5  # every decode block's byte before the read
NUM_BLOCKS = 8
LOCAL_IDS = ((1, 2), (4, 7))  # per KV cache group: scattered, never block 0 (vLLM's null block)
REMOTE_IDS = ((6, 3), (5, 2))  # read into LOCAL_IDS pairwise, in another order


__all__ = ["case_id"]


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
        self,
        model,
        case,
        setup: str,
        engine_id: str,
        port: int | None = None,
        handoff_of: Callable[..., HandOff] | None = None,
        **build,
    ) -> None:
        """`handoff_of` builds the hand-off from the case and a kv_transfer_config (e.g. the
        extensible_handoff fixture); by default build_worker_kv_caches of NUM_BLOCKS blocks."""
        backend, kind, block_size, dtype = case
        self.port = port or free_port()  # the side channel port of its TP rank 0
        if handoff_of is None:
            handoff_of = functools.partial(
                build_worker_kv_caches, num_blocks=NUM_BLOCKS, model=model
            )
        # On CUDA P2P asks vLLM for BLNHC (none for MLA models: vLLM then resolves its default,
        # LBNHC, and splits kernel blocks); on the CPU platform it asks for none.
        with mock.patch.object(vllm_layout, "_platform_is_cpu", lambda: kind == "mla"):
            self.handoff: HandOff = handoff_of(
                backend,
                kind,
                block_size,
                dtype,
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
        for block_id in range(decode.handoff.num_blocks):
            got = decode.handoff.block_bytes(layer_name, block_id)
            if block_id in moved:
                want = prefill.handoff.block_bytes(layer_name, moved[block_id])
                assert got.equal(want), (layer_name, block_id, "not the prefill side's bytes")
            else:
                assert bool((got == SENTINEL).all()), (layer_name, block_id, "was written")


def pair(model, case, setup: str, **build) -> tuple[Side, Side]:
    """A prefill side of random bytes and a decode side of SENTINEL (build: Side's)."""
    prefill = Side(model, case, setup, "prefill", **build)
    decode = Side(model, case, setup, "decode", **build)
    prefill.fill(seed=1)
    decode.fill(seed=None)
    return prefill, decode


def setup_cases() -> list[tuple[tuple[str, str, int, str], str]]:
    """Every case untraced; traced (the same bytes through the instrumentation) once per kind,
    as each NIXL pair costs a second of set-up on two cores."""
    cases = one_case_per_kind()
    first_of_kind = {case[1]: case for case in reversed(cases)}
    return [(case, "core") for case in cases] + [
        (case, "traced") for case in first_of_kind.values()
    ]
