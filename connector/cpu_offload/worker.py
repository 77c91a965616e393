"""Worker half of the CPU offload connector: copies whole blocks between KV cache and host pool."""

import time
from dataclasses import dataclass

import torch

from kvscope.connector.cpu_offload.config import OffloadConfig
from kvscope.connector.cpu_offload.convoy_events import convoy_recorded
from kvscope.connector.cpu_offload.convoys import LoadConvoys
from kvscope.connector.cpu_offload.copy.engine import CopyResult, Direction
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer, find_block_dim
from kvscope.connector.cpu_offload.copy_events import blocks_loaded, copy_recorded, load_failed
from kvscope.connector.cpu_offload.faults import FaultInjector
from kvscope.connector.cpu_offload.host_pool import num_host_blocks
from kvscope.connector.cpu_offload.kernel_blocks import group_layers
from kvscope.connector.cpu_offload.memory_checks import check_private_pool
from kvscope.connector.cpu_offload.metadata import BlockTransfer, OffloadMetadata, OffloadWorkerMeta
from kvscope.connector.cpu_offload.replicas import ReplicaGroup
from kvscope.connector.cpu_offload.stats import Samples, WorkerCounters
from kvscope.traces.outcomes import outcome_of_policy


@dataclass
class PendingCopy:
    transfer: BlockTransfer
    direction: Direction
    deadline: float
    timed_out: bool = False  # failed at its deadline; its result may still be on its way


class OffloadWorker:
    """Owns the host buffer and the copy engine of one worker.

    Never touches scheduler state: it runs the copies OffloadMetadata names and reports outcomes
    (finished loads and stores, failed blocks) back through vLLM's worker output.
    """

    def __init__(
        self,
        config: OffloadConfig,
        faults: FaultInjector,
        num_device_blocks: int,
        failure_policy: str | None = None,
        world_size: int = 1,
        replicas: ReplicaGroup | None = None,
    ):
        self.config = config
        self.faults = faults
        self.num_device_blocks = num_device_blocks
        self.failure_policy = failure_policy
        self.replicas = replicas or ReplicaGroup()
        self.pool_bytes = config.bytes_per_rank(world_size, self.replicas.size)
        # What vLLM does with a failed load; None when a parent (the Multi) decides and says so.
        self.failure_outcome: str | None = outcome_of_policy(failure_policy)
        self.buffer: HostBuffer | None = None
        self.copies = None
        self.asleep = False  # vLLM's sleep mode unmapped the KV cache: no copy may start
        self._pending: dict[int, PendingCopy] = {}
        self._to_flush: set[str] = set()
        self._load_errors: set[int] = set()
        self._failed_loads: set[str] = set()  # request ids, for vLLM's failed_recving
        self._meta = OffloadWorkerMeta()
        self.convoys = LoadConvoys()  # loads queued behind loads of the same host blocks
        # Failed loads are counted once, by the scheduler half, when every rank reported.
        self.stats = WorkerCounters()
        self.samples = Samples()  # per-copy durations and sizes for the stats' histograms

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Builds the host pool and copy engine over vLLM's views, one per distinct memory
        (KV-sharing layers alias another layer's view: copying both would move it twice and
        size host blocks larger than the scheduler half does)."""
        layers = list({view.data_ptr(): view for view in kv_caches.values()}.values())
        # Kernel-block views (the backend's kernel block is smaller than the KV block) are
        # regrouped so each copy moves whole KV blocks, as vLLM's own offloader does.
        grouped = group_layers(layers, self.num_device_blocks)
        if grouped is not None:
            layers, block_dim = grouped, 0
        else:
            # vLLM's KV layouts put blocks first or second ([N, ...] or [2, N, ...]); looking
            # only there keeps a head size that equals the block count from being taken for it.
            block_dim = find_block_dim(layers[0].shape[:2], self.num_device_blocks)
        layout = BlockLayout.of(layers, block_dim)
        pin = layers[0].device.type == "cuda"
        num_blocks = num_host_blocks(self.pool_bytes, layout.bytes_per_block)
        # Replicated TP ranks (MLA) map one shared pool; a follower's stores copy nothing.
        memory = self.replicas.host_memory(
            layout.num_layers * num_blocks * layout.layer_block_numel, layout.dtype
        )
        if memory is None:
            check_private_pool(num_blocks * layout.bytes_per_block)
        self.buffer = HostBuffer(layout, num_blocks, pin, memory)
        self.copies = self.replicas.copies(make_copy_engine(layers, self.buffer, block_dim))

    def start_loads(self, metadata: OffloadMetadata) -> None:
        self._check_pool_size(metadata)
        self._refuse_while_asleep()
        # Taken here, not in start_stores: with a speculator, vLLM's runners call
        # get_transfer_results before wait_for_save, and a flush first seen there would be
        # reported a step late. Every runner starts loads before both, each step.
        self._to_flush |= metadata.reqs_to_flush
        for transfer in metadata.reqs_to_load:
            fault = self.faults.on_load(transfer.req_id)
            job_id = self.copies.submit_load(
                transfer.device_block_ids,
                transfer.host_block_ids,
                delay_s=fault.delay_s,
                fail_reason=fault.fail_reason,
            )
            deadline = time.monotonic() + self.config.load_timeout_s
            self._pending[job_id] = PendingCopy(transfer, Direction.LOAD, deadline)
            self.convoys.submitted(job_id, transfer)

    def start_stores(self, metadata: OffloadMetadata) -> None:
        """After the forward: the blocks' data is final (on CUDA the copy stream waits for it)."""
        self._refuse_while_asleep()
        for transfer in metadata.reqs_to_store:
            job_id = self.copies.submit_store(
                transfer.device_block_ids, transfer.host_block_ids, delay_s=self.faults.on_store()
            )
            self._pending[job_id] = PendingCopy(transfer, Direction.STORE, float("inf"))

    def wait_for_stores(self, req_ids: set[str]) -> None:
        """Before vLLM reuses preempted requests' blocks, the stores reading them must end.

        Only theirs: vLLM calls this every step, and on CUDA waiting for any store waits for
        the forward queued before it, which would take away async scheduling's overlap.
        """
        for job_id, pending in list(self._pending.items()):
            if pending.direction is Direction.STORE and pending.transfer.req_id in req_ids:
                self.copies.wait(job_id)

    def poll(self) -> tuple[set[str], set[str]]:
        """(finished_sending, finished_recving) since the last poll."""
        recving: set[str] = set()
        for result in self.copies.poll() if self.copies else ():
            pending = self._pending.pop(result.job_id, None)
            if pending is not None:
                self._finish(pending, result, recving)
        recving |= self._time_out_loads()
        sending = {r for r in self._to_flush if not self._has_pending_stores(r)}
        self._to_flush -= sending
        return sending, recving

    def _finish(self, pending: PendingCopy, result: CopyResult, recving: set[str]) -> None:
        transfer, direction = pending.transfer, pending.direction
        copy_recorded(transfer, direction, result)
        self.stats.add_copy(direction, result.num_bytes if result.ok else 0, result.duration_s)
        if result.ok:
            self.samples.observe(f"{direction.value}_seconds", result.duration_s)
            self.samples.observe(f"{direction.value}_size_bytes", result.num_bytes)
        if pending.direction is Direction.STORE:
            outcomes = self._meta.stores_done if result.ok else self._meta.stores_failed
            outcomes[transfer.transfer_id] = 1
            return
        recving.add(transfer.req_id)
        started_at = result.finished_at - result.duration_s
        convoy = self.convoys.finished(
            result.job_id, result.submitted_at, started_at, result.finished_at
        )
        if convoy is not None:
            convoy_recorded(convoy)
        if result.ok and not pending.timed_out:
            self._meta.loads_done[transfer.req_id] = 1
            blocks_loaded(transfer)
        else:
            cause = "timeout" if pending.timed_out else result.error or "load failed"
            self._fail_load(transfer, cause)

    def _fail_load(self, transfer: BlockTransfer, cause: str) -> None:
        self._load_errors.update(transfer.device_block_ids)
        self._failed_loads.add(transfer.req_id)
        self._meta.loads_failed[transfer.req_id] = 1
        load_failed(transfer, cause, self.failure_policy, self.failure_outcome)

    def _time_out_loads(self) -> set[str]:
        """Loads past their deadline fail. One whose copy never began or already ended is
        reported now; one still copying (a CUDA stream cannot drop it) is reported with its
        result: vLLM recomputes into reported blocks, and the scheduler half frees the host
        blocks, so neither may be handed back while the copy can still write or read them."""
        now = time.monotonic()
        timed_out = set()
        for job_id, pending in list(self._pending.items()):
            if pending.timed_out or pending.deadline > now:
                continue
            pending.timed_out = True
            if self.copies.cancel(job_id):
                del self._pending[job_id]
                self.convoys.dropped(job_id)
                self._fail_load(pending.transfer, "timeout")
                timed_out.add(pending.transfer.req_id)
        return timed_out

    def _has_pending_stores(self, req_id: str) -> bool:
        return any(
            p.transfer.req_id == req_id and p.direction is Direction.STORE
            for p in self._pending.values()
        )

    def take_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def take_failed_loads(self) -> set[str]:
        """Requests whose load failed since the last call (each also in finished_recving)."""
        failed, self._failed_loads = self._failed_loads, set()
        return failed

    def take_worker_meta(self) -> OffloadWorkerMeta | None:
        meta = self._meta
        if meta.is_empty():
            return None
        self._meta = OffloadWorkerMeta()
        return meta

    def _check_pool_size(self, metadata: OffloadMetadata) -> None:
        if self.buffer is not None and metadata.num_host_blocks != self.buffer.num_blocks:
            raise RuntimeError(
                f"scheduler planned {metadata.num_host_blocks} host blocks, the worker has "
                f"{self.buffer.num_blocks}: both must derive them from cpu_bytes_to_use "
                f"({self.pool_bytes} bytes a rank)"
            )

    def stores_in_flight(self) -> dict[str, set[int]]:
        """Per request, the device block ids its stores not yet reported may still read."""
        reading: dict[str, set[int]] = {}
        for pending in self._pending.values():
            if pending.direction is Direction.STORE:
                blocks = reading.setdefault(pending.transfer.req_id, set())
                blocks.update(pending.transfer.device_block_ids)
        return reading

    def held(self) -> dict[str, object]:
        """Copies not yet reported, by job id, and the copy engine's unfinished jobs; both
        falsy once every copy ended (a cancelled one leaves the engine when its thread runs)."""
        return {
            "copies_pending": sorted(self._pending),
            "copy_jobs": self.copies.num_pending if self.copies is not None else 0,
        }

    def sleep(self, timeout_s: float) -> None:
        """vLLM's sleep mode is about to unmap the KV cache: every copy ends first.

        Waits for each copy (a load past timeout_s is cancelled; its request is reported
        failed, so vLLM recomputes it), then refuses copies until wake_up. The results are
        reported by the next poll. The KV views and the host buffer stay: vLLM maps the KV
        cache back at the same addresses and does not register it again, and the host pool
        keeps what the scheduler half's index says it holds.
        """
        self.asleep = True
        if self.copies is None:
            return
        deadline = time.monotonic() + timeout_s
        for job_id in list(self._pending):
            if not self.copies.wait(job_id, max(0.0, deadline - time.monotonic())):
                self._pending[job_id].timed_out = True
                self.copies.cancel(job_id)
                # A copy a stream cannot withdraw must still end before the pages go.
                self.copies.wait(job_id)

    def wake_up(self) -> None:
        self.asleep = False

    def _refuse_while_asleep(self) -> None:
        if self.asleep:
            raise RuntimeError(
                "the offload connector was asked to copy KV while vLLM's sleep mode has the "
                "KV cache unmapped (unregister_kv_caches came without restore_kv_caches): "
                "wake the engine (wake_up with the kv_cache tag) before scheduling requests"
            )

    def shutdown(self) -> None:
        if self.copies is not None:
            self.copies.shutdown(timeout_s=10)
        if self.buffer is not None:
            # After the copies: on CUDA shutdown waits for both streams, so no DMA reads it.
            self.buffer.close()
