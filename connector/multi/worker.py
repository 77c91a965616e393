"""Worker side of the MultiConnector: merges children's reports, attributes failed blocks to
the child whose load they belong to, and holds back a failed load the scheduler can retry."""

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

from kvscope.connector.multi.children import Child
from kvscope.connector.multi.groups import GroupBlock, flat, matching, pairs
from kvscope.connector.multi.metadata import (
    MULTI_METADATA_VERSION,
    LoadEnd,
    LoadRoute,
    MultiMetadata,
    MultiWorkerMeta,
)


class MultiWorker:
    """Per-step bookkeeping between vLLM's model runner and the children's worker halves."""

    def __init__(
        self, children: list[Child], fallback: bool, world_size: int = 1, num_groups: int = 1
    ) -> None:
        self.children = children
        self.fallback = fallback
        # With several KV cache groups vLLM takes failed loads by request (failed_recving) only:
        # block ids are per group, so invalid_block_ids cannot name them.
        self.by_request_only = num_groups > 1
        # With more than one rank a load this rank finished may still fail on another: every
        # routed load waits for the scheduler's word, so that all ranks fall back together.
        self.hold_every_load = fallback and world_size > 1
        self.routes: dict[str, LoadRoute] = {}
        # per routed request, until it finishes
        self.failed_blocks: dict[str, set[GroupBlock]] = {}
        self.extra_saves: dict[str, int] = {}
        self._to_fail: dict[str, frozenset[GroupBlock]] = {}
        self._errors_to_report: set[int] = set()
        self._loads_ended: dict[str, LoadEnd] = {}  # since the last worker_meta
        # held back well loaded -> its missing blocks
        self.loads_held_back: dict[str, frozenset[GroupBlock]] = {}
        self._to_release: set[str] = set()
        self._children_recving: list[dict[str, int]] = [{} for _ in children]

    def bind(self, metadata: MultiMetadata) -> None:
        if metadata.version != MULTI_METADATA_VERSION:
            raise ValueError(
                f"Multi metadata v{metadata.version}, expected v{MULTI_METADATA_VERSION}: the "
                "scheduler and workers run different kvscope versions; restart them together"
            )
        self.routes.update(metadata.reqs_to_route)
        self._to_fail.update(metadata.reqs_to_fail)
        self.extra_saves.update(metadata.extra_async_saves)
        self._to_release |= metadata.reqs_to_release
        for child, child_metadata in zip(self.children, metadata.children, strict=True):
            child.connector.bind_connector_metadata(child_metadata)

    def transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        merged = KVConnectorTransferResults()
        for index, child in enumerate(self.children):
            results = child.connector.get_transfer_results(finished_req_ids)
            self._attribute_errors(index, child.connector.get_block_ids_with_load_errors())
            self._children_recving[index].update(dict.fromkeys(results.finished_recving, 1))
            for req_id in results.finished_recving:  # failed_recving is a subset
                self._finish_load(index, req_id, req_id in results.failed_recving, merged)
            for req_id in results.finished_sending:
                self._finish_send(req_id, merged)
        for req_id, blocks in self._to_fail.items():  # no child had the blocks
            self._report_received(req_id, set(blocks), merged, failed=True)
        self._to_fail = {}
        for req_id in self._to_release:
            self._release(req_id, merged)
        self._to_release = set()
        return merged

    def _attribute_errors(self, index: int, block_ids: set[int]) -> None:
        for req_id, route in self.routes.items():
            if route.child == index and (mine := matching(route.device_block_ids, block_ids)):
                self.failed_blocks.setdefault(req_id, set()).update(mine)
                block_ids = block_ids - flat(mine)
        self._errors_to_report |= block_ids  # not from a routed load: vLLM's policy decides

    def _finish_load(self, index: int, req_id: str, failed: bool, merged) -> None:
        route = self.routes.get(req_id)
        if route is None or route.child != index:  # the child's own load: its report stands
            self._report_received(req_id, set(), merged, failed)
            return
        failed_blocks = self.failed_blocks.pop(req_id, set())
        if failed and not failed_blocks:
            failed_blocks = pairs(route.device_block_ids)
        del self.routes[req_id]
        if self.fallback and (failed_blocks or self.hold_every_load):
            # Held back: the scheduler may retry elsewhere, or first hears from every rank.
            failed = bool(failed_blocks)
            self._loads_ended[req_id] = LoadEnd(
                index, int(not failed), int(failed), frozenset(failed_blocks)
            )
            if not failed:
                self.loads_held_back[req_id] = frozenset(pairs(route.missing_block_ids))
            return
        self._report_received(req_id, failed_blocks | pairs(route.missing_block_ids), merged)

    def _release(self, req_id: str, merged) -> None:
        """The scheduler heard every rank load it well: vLLM may count it received now."""
        self._report_received(req_id, set(self.loads_held_back.pop(req_id, ())), merged)

    def _report_received(
        self, req_id: str, failed_blocks: set[GroupBlock], merged, failed: bool = False
    ) -> None:
        """Received, and failed when any block failed: by request, and with one KV cache group
        also by block (vLLM recomputes from the first invalid block)."""
        merged.finished_recving.add(req_id)
        if failed or failed_blocks:
            merged.failed_recving.add(req_id)
        if not self.by_request_only:
            self._errors_to_report |= flat(failed_blocks)

    def _finish_send(self, req_id: str, merged) -> None:
        """A request saved by several children is done when the last one says so."""
        pending = self.extra_saves.get(req_id, 0)
        if pending:
            self.extra_saves[req_id] = pending - 1
            if pending == 1:
                del self.extra_saves[req_id]
            return
        merged.finished_sending.add(req_id)

    def held(self) -> dict[str, object]:
        """What this half still holds, by kind (all falsy when idle and leak-free); the
        children's halves answer for themselves."""
        return {
            "routes": sorted(self.routes),
            "failed_blocks": {req: sorted(blocks) for req, blocks in self.failed_blocks.items()},
            "extra_saves": dict(self.extra_saves),
            "loads_held_back": {req: sorted(b) for req, b in self.loads_held_back.items()},
        }

    def take_load_errors(self) -> set[int]:
        errors, self._errors_to_report = self._errors_to_report, set()
        return errors

    def worker_meta(self) -> MultiWorkerMeta | None:
        metas = tuple(child.connector.build_connector_worker_meta() for child in self.children)
        ended, self._loads_ended = self._loads_ended, {}
        recving = tuple(self._children_recving)
        self._children_recving = [{} for _ in self.children]
        if ended or any(recving) or any(meta is not None for meta in metas):
            return MultiWorkerMeta(metas, ended, recving)
        return None
