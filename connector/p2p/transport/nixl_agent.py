"""Creating a NIXL agent over a KV layout: NIXL's package for this torch, naming and clean-up."""

from __future__ import annotations

import importlib
import logging
import os
import uuid
from types import ModuleType
from typing import Any, Final

import torch

from kvscope.connector.p2p.transport import ucx_lanes
from kvscope.connector.p2p.transport.layout import KVLayout
from kvscope.connector.p2p.transport.results import NixlReadFacts, PeerRejectedError

logger = logging.getLogger(__name__)

NIXL_VERSION: Final = "1.5.1"
"""The NIXL release kvscope is tested with (scripts/setup.sh installs it)."""
CPU_TORCH_PACKAGE: Final = "nixl_cu12"
"""NIXL's package beside a CPU torch: its UCX backend moves host memory without CUDA."""


def nixl_package(torch_cuda: str | None) -> str:
    """NIXL's backend package for a torch built for CUDA `torch_cuda` (e.g. '13.0'; None: CPU).

    NIXL's native libraries link one CUDA major, so beside a cu13 torch only nixl_cu13 loads."""
    if not torch_cuda:
        return CPU_TORCH_PACKAGE
    major = torch_cuda.split(".")[0]
    if not major.isdigit():
        raise ValueError(f"torch reports CUDA {torch_cuda!r}: expected a version like '13.0'")
    return f"nixl_cu{major}"


def install_command(package: str) -> str:
    """The pip line that installs a NIXL backend package without pulling a second torch."""
    return f"pip install --no-deps {package.replace('_', '-')}=={NIXL_VERSION}"


def load_nixl_api() -> ModuleType:
    """NIXL's Python API from the package matching torch's CUDA build (torch.version.cuda).

    Imported directly rather than through the `nixl` meta package, so that the error names the
    one package to install."""
    package = nixl_package(torch.version.cuda)
    try:
        return importlib.import_module(f"{package}._api")
    except ModuleNotFoundError as exc:
        if exc.name not in (package, f"{package}._api"):
            raise
        raise ImportError(
            f"the P2P connector needs NIXL's {package} package for this torch (CUDA"
            f" {torch.version.cuda or 'none: CPU build'}): {install_command(package)}"
        ) from None


def new_agent(engine_id: str, tp_rank: int) -> tuple[Any, str]:
    """A UCX agent without NIXL's progress thread (it spins a whole core even when idle).

    NIXL serialises the agent's own calls (STRICT): handshakes add peers from a background
    thread while the engine and poller threads read and progress. NIXL's per-transfer
    telemetry is on (read_facts), and UCX is asked for its protocol tables (ucx_lanes)."""
    api = load_nixl_api()
    ucx_lanes.prepare_before_agent()
    # Unique per process start: loading bad metadata under a name poisons that name in peers.
    name = f"kvscope-{engine_id}-tp{tp_rank}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    config = api.nixl_agent_config(
        enable_prog_thread=False,
        capture_telemetry=True,
        backends=["UCX"],
        sync_mode=api.nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
    )
    agent = api.nixl_agent(name, config)
    ucx_lanes.forward_warnings()  # what UCX said while starting
    return agent, name


def register_layout(agent: Any, layout: KVLayout) -> tuple[Any, dict[bool, Any]]:
    """Register the KV cache's memory; returns it and the local descriptor lists by unit
    (True: one per block across layers; False: one per layer page), each the layout offers."""
    regions = [(a, n, layout.device_id, "") for a, n in layout.registration_regions()]
    registered = agent.register_memory(regions, layout.memory_kind)
    local_dlists = {
        per_block: agent.prep_xfer_dlist(
            "NIXL_INIT_AGENT", layout.descriptor_array(per_block), layout.memory_kind
        )
        for per_block, offered in ((True, layout.block_runs), (False, layout.page_runs))
        if offered
    }
    return registered, local_dlists


def prepare_peer(
    agent: Any, own_name: str, agent_metadata: bytes, layout: KVLayout, per_block: bool
) -> tuple[str, Any]:
    """NIXL's part of a handshake: load the peer's agent, prepare its blocks' descriptors (per
    block or per layer page, as both sides share), connect. Returns its name and descriptors."""
    try:
        name = as_str(agent.add_remote_agent(agent_metadata))
        if name == own_name:
            raise PeerRejectedError("the peer's metadata is our own agent's")
        remote_dlist = agent.prep_xfer_dlist(
            name, layout.descriptor_array(per_block), layout.memory_kind
        )
        agent.make_connection(name)
    except PeerRejectedError:
        raise
    except Exception as exc:
        raise PeerRejectedError(
            f"NIXL refused the metadata of engine {layout.engine_id!r} "
            f"({type(exc).__name__}: {exc}): handshake again with a live peer"
        ) from None
    return name, remote_dlist


def read_facts(agent: Any, handle: Any) -> NixlReadFacts:
    """NIXL's own word on a completed transfer: its backend and telemetry ('unknown' and None
    for what it would not say; never raises)."""
    try:
        backend = str(agent.query_xfer_backend(handle))
    except Exception:
        backend = ucx_lanes.UNKNOWN
    try:
        telemetry = agent.get_xfer_telemetry(handle)
        return NixlReadFacts(backend, int(telemetry.totalBytes), int(telemetry.xferDuration))
    except Exception:
        return NixlReadFacts(backend)


def as_str(name: str | bytes) -> str:
    """NIXL returns agent names as bytes from some calls and str from others."""
    return name.decode() if isinstance(name, bytes) else name


def try_cleanup(call: Any, *args: Any) -> bool:
    """Run a NIXL clean-up call; False (logged) if it failed, so clean-up goes on."""
    try:
        call(*args)
        return True
    except Exception as exc:
        logger.warning("p2p: NIXL clean-up %s failed: %s", getattr(call, "__name__", call), exc)
        return False


def release_quietly(handle: Any) -> bool:
    """Retry releasing a transfer NIXL could not cancel before; silent, as it runs every step."""
    try:
        handle.release()
        return True
    except Exception:
        return False
