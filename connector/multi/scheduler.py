"""Scheduler side of the MultiConnector: which child serves each load, and fallback on failure."""

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

from kvscope.connector.common.rank_tally import RankTally
from kvscope.connector.multi import groups
from kvscope.connector.multi.children import Child
from kvscope.connector.multi.groups import GroupBlock, GroupBlockIds
from kvscope.connector.multi.metadata import LoadEnd, LoadRoute, MultiMetadata, MultiWorkerMeta
from kvscope.traces import names
from kvscope.traces.attribute_values import lookup_attributes
from kvscope.traces.facts import add_event
from kvscope.traces.hook_spans import child_hook_span
from kvscope.traces.outcomes import SERVED_BY_FALLBACK, outcome_of_policy

if TYPE_CHECKING:
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request


@dataclass
class LoadPlan:
    """A request's external hit: who serves it, where it goes, what to retry with."""

    request: "Request"
    blocks: "KVCacheBlocks"  # from the allocation, reused for a fallback
    num_computed_tokens: int
    num_tokens: int
    child: int
    device_block_ids: GroupBlockIds  # what this child loads, per KV cache group
    hit_block_ids: GroupBlockIds = ()  # the whole original hit (a fallback may load less)
    failed_children: set[int] = field(default_factory=set)
    finished: bool = False  # aborted or failed while loading: a failed load is not retried


class MultiScheduler:
    """Asks children in order; the first with a hit serves it; a failed load falls back."""

    def __init__(
        self,
        children: list[Child],
        block_size: int,
        fallback: bool,
        engine_id: str = "",
        failure_policy: str | None = None,
        world_size: int = 1,
        num_groups: int = 1,
    ) -> None:
        self.children = children
        self.num_groups = num_groups
        self.failure_policy = failure_policy or "recompute"
        self.span_attributes = {names.ENGINE_ID: engine_id}
        self.block_size = block_size
        self.fallback = fallback
        self.serving: dict[str, int] = {}  # req -> child chosen at lookup
        self.computed: dict[str, int] = {}  # req -> local hit at lookup
        self.loads: dict[str, LoadPlan] = {}
        self._routes: dict[str, LoadRoute] = {}
        self._to_fail: dict[str, frozenset[GroupBlock]] = {}
        self._extra_saves: dict[str, int] = {}
        self._to_release: set[str] = set()
        # vLLM sums one step's reports over ranks; these sum them over steps.
        self.load_reports: RankTally[str] = RankTally(world_size)
        self._ends_so_far: dict[str, LoadEnd] = {}
        self.recv_reports: list[RankTally[str]] = [RankTally(world_size) for _ in children]

    def span(self, index: int, hook: str, **attributes: Any):
        """A span for one child's part of a hook, nested under the Multi's span for it; none
        when the Multi's own hook is not traced (e.g. an idle engine step)."""
        if not trace.get_current_span().is_recording():
            return contextlib.nullcontext(trace.INVALID_SPAN)
        child = self.children[index]
        return child_hook_span(
            child.name, type(child.connector).__name__, hook, **self.span_attributes, **attributes
        )

    def lookup(
        self,
        request: "Request",
        num_computed_tokens: int,
        skip: set[int] = frozenset(),
        async_only: bool = False,
    ):
        """(tokens, async, child) of the first child with a hit; every child is asked."""
        req_id = str(request.request_id)
        found: tuple[int, bool, int] | None = None
        for index, child in enumerate(self.children):
            with self.span(
                index, "get_num_new_matched_tokens", **{names.REQUEST_ID: req_id}
            ) as span:
                tokens, is_async = child.connector.get_num_new_matched_tokens(
                    request, num_computed_tokens
                )
                span.set_attributes(lookup_attributes(num_computed_tokens, (tokens, is_async)))
            if tokens is None:  # a child still deciding: ask again next step
                return None, False, None
            usable = index not in skip and (is_async or not async_only)
            if found is None and tokens > 0 and usable:
                found = (tokens, is_async, index)
        self.computed[req_id] = num_computed_tokens
        if found is None:
            self.serving.pop(req_id, None)
            return 0, False, None
        self.serving[req_id] = found[2]
        return found

    def bind(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        """The serving child gets the blocks to fill; the others see 0 external tokens."""
        req_id = str(request.request_id)
        chosen = self.serving.get(req_id) if num_external_tokens > 0 else None
        for index, child in enumerate(self.children):
            tokens = num_external_tokens if index == chosen else 0
            attributes = {names.TOKENS_TO_LOAD: tokens, names.REQUEST_ID: req_id}
            with self.span(index, "update_state_after_alloc", **attributes):
                child.connector.update_state_after_alloc(request, blocks, tokens)
        if chosen is None:
            return
        computed = self.computed.get(req_id, 0)
        # A hit may end inside a block (P2P pulls up to the last prompt token): that block is
        # loaded too, so a failure there is the child's to report, not vLLM's to see.
        first = computed // self.block_size
        end = -(-(computed + num_external_tokens) // self.block_size)
        device = groups.load_block_ids(blocks, first, end)
        self.loads[req_id] = LoadPlan(
            request, blocks, computed, num_external_tokens, chosen, device, device
        )
        self._routes[req_id] = LoadRoute(chosen, device)
        add_event(
            "kvscope.multi.load_routed",
            **{names.REQUEST_ID: req_id, names.CONNECTOR_CHILD: self.children[chosen].name},
            **groups.span_attributes(device),
        )

    def build_metadata(self, scheduler_output: "SchedulerOutput") -> MultiMetadata:
        metas = []
        for index, child in enumerate(self.children):
            with self.span(index, "build_connector_meta"):
                metas.append(child.connector.build_connector_meta(scheduler_output))
        metadata = MultiMetadata(
            tuple(metas), self._routes, self._to_fail, self._to_release, self._extra_saves
        )
        self._routes, self._to_fail, self._to_release, self._extra_saves = {}, {}, set(), {}
        return metadata

    def on_worker_output(self, connector_output: "KVConnectorOutput") -> None:
        """Hands each child its own worker metadata; handles loads that failed on a child."""
        multi_meta = connector_output.kv_connector_worker_meta
        recving = connector_output.finished_recving
        if isinstance(multi_meta, MultiWorkerMeta):
            children_recving = [
                {req_id for req_id, _ in tally.add(counts, {})}
                for tally, counts in zip(
                    self.recv_reports, multi_meta.children_recving, strict=True
                )
            ]
        try:
            for index, child in enumerate(self.children):
                if isinstance(multi_meta, MultiWorkerMeta):
                    connector_output.kv_connector_worker_meta = multi_meta.children[index]
                    connector_output.finished_recving = children_recving[index]
                child.connector.update_connector_output(connector_output)
        finally:
            connector_output.kv_connector_worker_meta = multi_meta
            connector_output.finished_recving = recving
        for req_id in connector_output.finished_recving or ():
            self.loads.pop(req_id, None)
        if isinstance(multi_meta, MultiWorkerMeta):
            self._on_load_ends(multi_meta.loads_ended)

    def _on_load_ends(self, ends: dict[str, LoadEnd]) -> None:
        """Loads the workers held back: once every rank reported, released or retried."""
        for req_id, end in ends.items():
            so_far = self._ends_so_far.get(req_id)
            self._ends_so_far[req_id] = end if so_far is None else so_far.plus(end)
        ok = {req_id: end.ranks_ok for req_id, end in ends.items()}
        failed = {req_id: end.ranks_failed for req_id, end in ends.items()}
        for req_id, all_ok in self.load_reports.add(ok, failed):
            end = self._ends_so_far.pop(req_id)
            if all_ok:
                self._to_release.add(req_id)
            else:
                self._fall_back(req_id, end.child, end.failed_block_ids)

    def _fall_back(self, req_id: str, failed_child: int, failed_blocks: frozenset[GroupBlock]):
        """Asks the other children for the same blocks; else the failure goes to the policy.
        With several KV cache groups only a fallback with the whole hit serves it: vLLM takes
        their failures by request, so a shorter one would be recomputed whole anyway."""
        plan = self.loads.get(req_id)
        if plan is None:
            return
        if plan.finished:  # nothing to retry for: vLLM may free the blocks now
            self.loads.pop(req_id)
            self._to_fail[req_id] = failed_blocks
            return
        plan.failed_children.add(failed_child)
        # Only an asynchronous child can load out of band, while the request waits.
        tokens, _, child = self.lookup(
            plan.request, plan.num_computed_tokens, plan.failed_children, async_only=True
        )
        failure = {
            names.REQUEST_ID: req_id,
            names.FAILURE_CAUSE: "load_error",
            names.CONNECTOR_CHILD: self.children[failed_child].name,
            names.FAILURE_POLICY: self.failure_policy,
        }
        if tokens and self.num_groups > 1 and tokens < plan.num_tokens:
            tokens = 0
        if not tokens:
            outcome = outcome_of_policy(self.failure_policy)
            add_event(names.EVENT_LOAD_FAILED, **failure, **{names.FAILURE_OUTCOME: outcome})
            self.bind(plan.request, plan.blocks, 0)  # releases what the lookup took
            self.loads.pop(req_id, None)
            self._to_fail[req_id] = failed_blocks
            return
        self.bind(plan.request, plan.blocks, min(tokens, plan.num_tokens))
        fallback = self.loads[req_id]
        fallback.failed_children = plan.failed_children
        fallback.hit_block_ids = plan.hit_block_ids
        missing = groups.missing(plan.hit_block_ids, fallback.device_block_ids)
        self._routes[req_id] = LoadRoute(child, fallback.device_block_ids, missing)
        # Blocks the fallback does not have go to vLLM's policy with the rest of the request.
        count = len(groups.pairs(missing))
        outcome = outcome_of_policy(self.failure_policy) if count else SERVED_BY_FALLBACK
        add_event(
            names.EVENT_LOAD_FAILED,
            **failure,
            **{
                names.FAILURE_OUTCOME: outcome,
                "kvscope.multi.blocks_not_in_fallback": count,
                "kvscope.multi.fallback_child": self.children[child].name,
            },
        )

    def held(self) -> dict[str, object]:
        """What this half still holds, by kind (all falsy when idle and leak-free); the
        children's halves answer for themselves."""
        return {
            "loads": sorted(self.loads),
            "serving": sorted(self.serving),
            "loads_reported_by_some_ranks": sorted(self.load_reports.pending()),
        }

    def finished(
        self, request: "Request", block_ids: tuple[list[int], ...], all_groups: bool
    ) -> tuple[bool, dict | None]:
        """request_finished (all_groups False: one group's ids) or request_finished_all_groups
        for every child: a child that is not SupportsHMA gets request_finished with group 0,
        which is all there is (several groups refused such children at start)."""
        req_id = str(request.request_id)
        delayed, params = 0, None
        attributes = {names.REQUEST_ID: req_id, names.KV_CACHE_GROUP_COUNT: len(block_ids)}
        for index, child in enumerate(self.children):
            with self.span(index, "request_finished", **attributes):
                delay, child_params = _finish_child(child, request, block_ids, all_groups)
            delayed += bool(delay)
            if child_params:
                clash = set(params or {}) & set(child_params)
                if clash:
                    raise RuntimeError(f"children returned the same kv_transfer_params {clash}")
                params = {**(params or {}), **child_params}
        if delayed > 1:
            self._extra_saves[req_id] = delayed - 1
        if (plan := self.loads.get(req_id)) is not None:
            plan.finished = True
        self.serving.pop(req_id, None)
        self.computed.pop(req_id, None)
        return delayed > 0, params


def _finish_child(
    child: Child, request: "Request", block_ids: tuple[list[int], ...], all_groups: bool
):
    if all_groups and supports_hma(child.connector):
        return child.connector.request_finished_all_groups(request, block_ids)
    if len(block_ids) != 1:
        raise RuntimeError(
            f"child {child.name} ({type(child.connector).__name__}) does not support HMA and got "
            f"{len(block_ids)} KV cache groups: start vLLM with --disable-hybrid-kv-cache-manager"
        )
    return child.connector.request_finished(request, block_ids[0])
