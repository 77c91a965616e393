"""A peer the transport handshook with, and what is done per peer: post a READ, let it go."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kvscope.connector.p2p.transport.layout import BlockMapping, KVLayout
from kvscope.connector.p2p.transport.nixl_agent import try_cleanup
from kvscope.connector.p2p.transport.reads import Inflight
from kvscope.connector.p2p.transport.results import TransportError


@dataclass
class Peer:
    """A peer's agent, layout, how our blocks map onto its own, and its prepared descriptors."""

    agent_name: str
    layout: KVLayout
    mapping: BlockMapping
    remote_dlist: Any  # nixl_prepped_dlist_handle, per block or per layer page as mapping says

    def post_read(
        self,
        agent: Any,
        local_dlists: dict[bool, Any],
        xfer: Inflight,
        remote_ids: list[int],
        local_ids: list[int],
        notif_msg: bytes,
        bytes_per_block: int,
    ) -> str:
        """Post one READ of these blocks (every layer) into ours: NIXL's state of it ("DONE"
        at once when there is nothing to read; the notification still goes out)."""
        try:
            local_idx, remote_idx = self.mapping.descriptor_ids(local_ids, remote_ids)
        except ValueError as exc:
            raise TransportError(f"bad block ids: {exc}") from None
        xfer.nbytes = len(local_ids) * bytes_per_block
        xfer.descriptors = len(local_idx)
        xfer.started = time.monotonic()
        if not len(local_idx):
            if notif_msg:  # the owner may be waiting for it to free blocks
                agent.send_notif(self.agent_name, notif_msg)
            return "DONE"
        local_dlist = local_dlists[self.mapping.per_block]
        xfer.handle = agent.make_prepped_xfer(
            "READ", local_dlist, local_idx, self.remote_dlist, remote_idx, notif_msg
        )
        return agent.transfer(xfer.handle)

    def release(self, agent: Any, forget_agent: bool = True) -> None:
        """Release its descriptors and, unless a new handshake replaced it, its agent."""
        try_cleanup(agent.release_dlist_handle, self.remote_dlist)
        if forget_agent:
            try_cleanup(agent.remove_remote_agent, self.agent_name)
