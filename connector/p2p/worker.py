"""Worker half of the P2P connector: the NIXL transport, the side channel, lender and puller.

Never touches scheduler state: it runs what P2PMetadata names and reports finished_sending,
finished_recving, failed blocks and why requests ended.
"""

import logging
from dataclasses import replace

import torch

from kvscope.connector.common.stats_schema import Samples
from kvscope.connector.p2p.config import P2PConfig
from kvscope.connector.p2p.lender import BlockLender
from kvscope.connector.p2p.metadata import P2P_METADATA_VERSION, P2PMetadata, P2PWorkerMeta
from kvscope.connector.p2p.puller import BlockPuller
from kvscope.connector.p2p.stats import WORKER_COUNTERS
from kvscope.connector.p2p.transport.nixl_transport import (
    LENT_CAUSE,
    NixlTransport,
    TransportConfig,
)
from kvscope.connector.p2p.transport.results import TransportError
from kvscope.connector.p2p.transport.side_channel import SideChannelServer
from kvscope.traces.outcomes import outcome_of_policy

logger = logging.getLogger(__name__)

_HOT_AFTER_HANDSHAKE_S = 2.0  # the peer usually connects and reads right after it
_RELEASE_TIMEOUT_S = 10.0  # how long unregister waits for NIXL to let go of cancelled reads


class P2PWorker:
    """One worker's P2P state; `serves` when this engine may prefill for others."""

    def __init__(
        self,
        config: P2PConfig,
        engine_id: str,
        serves: bool,
        failure_policy: str | None = None,
        tp_rank: int = 0,
        tp_size: int = 1,
    ) -> None:
        self.config = config
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.engine_id = engine_id
        self.serves = serves
        self.failure_policy = failure_policy or "recompute"
        self.failure_outcome: str | None = outcome_of_policy(failure_policy)
        self.transport: NixlTransport | None = None
        self.side_channel: SideChannelServer | None = None
        self.lender: BlockLender | None = None
        self.puller: BlockPuller | None = None
        self._no_samples = Samples()
        # Served to peers and told to the scheduler: leases naming an older one were revoked.
        self._registration = 0
        self._registration_told = 0
        self._leases_named = 0  # the registration the scheduler's leases named at the last step

    def register(
        self,
        kv_caches: dict[str, torch.Tensor],
        kv_layout: str | None = None,
        num_blocks: int | None = None,
        tensor_strides: tuple[int, int] | None = None,
    ) -> None:
        """Serve and read these views, described by what vLLM says of them (vllm_layout)."""
        transport_config = TransportConfig(transfer_timeout_s=self.config.read_timeout_s)
        self.transport = NixlTransport(
            self.engine_id,
            kv_caches,
            self.tp_rank,
            self.tp_size,
            transport_config,
            kv_layout,
            num_blocks,
            tensor_strides,
        )
        logger.info(
            "p2p: engine %s tp rank %d registered %d layers x %d blocks, layout %s, %s",
            self.engine_id,
            self.tp_rank,
            self.transport.layout.num_layers,
            self.transport.layout.num_blocks,
            self.transport.layout.kv_layout,
            "one run per block" if self.transport.layout.block_runs else "one run per layer page",
        )
        self.lender = BlockLender(self.transport)
        self.puller = BlockPuller(
            self.transport, self.config, self.failure_policy, self.failure_outcome, self.tp_rank
        )
        if self.serves:
            self._serve_side_channel()

    def _serve_side_channel(self) -> None:
        host, port = self.config.side_channel_host, self.config.side_channel_port_of(self.tp_rank)
        try:
            self.side_channel = SideChannelServer(host, port, on_request=self._on_handshake)
        except OSError as exc:
            raise RuntimeError(
                f"p2p: cannot serve the side channel on {host}:{port} ({exc}): give each engine"
                " its own kv_connector_extra_config side_channel_port"
            ) from None
        self._publish()
        logger.info(
            "p2p: engine %s tp rank %d serves its KV layout on %s:%s",
            self.engine_id,
            self.tp_rank,
            host,
            port,
        )

    def unregister(self) -> None:
        """vLLM lends the KV cache away (sleep, a weight update): peers are refused a handshake,
        reads into it fail (recomputed) once NIXL let go of them, lent blocks are revoked, the
        memory is deregistered. If NIXL holds a read, RuntimeError before anything is lent."""
        if self.transport is None:
            return
        if self.side_channel is not None:
            self.side_channel.withdraw(self.tp_rank, f"{LENT_CAUSE}: handshake again later")
        try:
            self.transport.suspend(_RELEASE_TIMEOUT_S)
        except TransportError as exc:
            self._publish()
            raise RuntimeError(f"p2p: cannot lend the KV cache away: {exc}") from None
        self.lender.revoke_all(LENT_CAUSE)
        self.puller.forget_peers()

    def restore(self) -> None:
        """The KV cache is back: register it again and serve the new registration."""
        if self.transport is None or not self.transport.suspended:
            return
        self.transport.resume()
        # Every lease made so far named at most _leases_named: none may be read now.
        self._registration = max(self._registration, self._leases_named + 1)
        self._publish()

    def _publish(self) -> None:
        if self.side_channel is not None and not self.transport.suspended:
            info = replace(self.transport.peer_info(), registration=self._registration)
            self.side_channel.publish(info)

    def _on_handshake(self) -> None:
        self.transport.expect_activity(_HOT_AFTER_HANDSHAKE_S)

    def start(self, metadata: P2PMetadata) -> None:
        if metadata.version != P2P_METADATA_VERSION:
            raise RuntimeError(
                f"P2P metadata version {metadata.version}, this worker speaks"
                f" {P2P_METADATA_VERSION}: scheduler and worker run different kvscope versions"
            )
        if self.transport is None:
            return
        self._leases_named = metadata.registration
        self.lender.hold(metadata.reqs_to_send, self._registration)
        self.puller.start(metadata.reqs_to_recv, metadata.reqs_to_release)

    def poll(self) -> tuple[set[str], set[str]]:
        """(finished_sending, finished_recving) since the last poll."""
        if self.transport is None:
            return set(), set()
        notifs = self.transport.get_notifs()
        sending = self.lender.collect(notifs, self.transport.expired_remote_reads())
        return sending, self.puller.poll()

    def take_load_errors(self) -> set[int]:
        return self.puller.take_load_errors() if self.puller else set()

    def take_failed_loads(self) -> set[str]:
        return self.puller.take_failed_loads() if self.puller else set()

    def take_worker_meta(self) -> P2PWorkerMeta | None:
        if self.transport is None:
            return None
        meta = P2PWorkerMeta(
            self.lender.take_leases_expired(), self.puller.take_loads_failed(), self._registration
        )
        if meta.leases_expired or meta.loads_failed or self._registration_told != meta.registration:
            self._registration_told = meta.registration
            return meta
        return None

    @property
    def stats(self) -> dict[str, float]:
        """This rank's counters by their wire names (the puller's and the lender's), for
        reading; {} before register."""
        if self.transport is None:
            return {}
        return {**self.lender.stats.as_dict(), **self.puller.stats.as_dict()}

    def report_values(self) -> tuple[dict[str, float], Samples]:
        """Cumulative counters of this rank's reads and loans, and its histogram samples (the
        lender's expired leases are the scheduler half's to count, once per request)."""
        if self.transport is None:
            return {}, self._no_samples
        stats = self.stats
        return {key: stats[key] for key in WORKER_COUNTERS if key in stats}, self.puller.samples

    def held(self) -> dict[str, object]:
        """What this half still holds, by kind (all falsy when idle and leak-free)."""
        if self.transport is None:
            return {"reads_in_flight": [], "handshakes_in_flight": {}, "lender_held": []}
        return {**self.puller.held(), **self.lender.held()}

    def shutdown(self) -> None:
        if self.side_channel is not None:
            self.side_channel.close()
        if self.puller is not None:
            self.puller.close()
        if self.transport is not None:
            self.transport.close()
