"""Creating a NIXL agent over a KV layout, and NIXL's naming and clean-up quirks."""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from nixl._api import nixl_agent, nixl_agent_config

from kvscope.connector.p2p.layout import KVLayout

logger = logging.getLogger(__name__)


def new_agent(engine_id: str, tp_rank: int) -> tuple[Any, str]:
    """A UCX agent without NIXL's progress thread (it spins a whole core even when idle)."""
    # Unique per process start: loading bad metadata under a name poisons that name in peers.
    name = f"kvscope-{engine_id}-tp{tp_rank}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    config = nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
    return nixl_agent(name, config), name


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
