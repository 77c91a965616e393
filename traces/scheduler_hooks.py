"""Traced scheduler-side hooks: each opens a span, delegates to the inner connector in one call."""

from typing import TYPE_CHECKING, Any, cast

from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA

from kvscope.traces import names
from kvscope.traces.attribute_values import (
    block_ids_attributes,
    finished_attributes,
    kv_blocks_ids,
    lookup_attributes,
    short_text,
)
from kvscope.traces.metadata import TracedMetadata, carry

if TYPE_CHECKING:
    from kvscope.traces.hook_host import ConnectorHost as _Host
    from kvscope.traces.hook_host import LoadsAsync
else:
    _Host = object


class SchedulerHooks(_Host):
    """Mixin for InstrumentedConnector: the hooks vLLM's scheduler calls."""

    def _request_hook(self, hook: str, request: Any, **attributes: Any):
        """A hook span in the request's trace, child of its kvscope.request span."""
        parent = self._sched.request_context(request)
        req_id = {names.REQUEST_ID: str(request.request_id)}
        return self._spans.hook(hook, parent, **req_id, **attributes)

    def on_new_request(self, request: Any) -> None:
        # A notification: the request span starts here; the hook gets a span of its own only
        # when the connector reports something in it.
        parent = self._sched.request_context(request)
        notify = self._inner.on_new_request
        return self._spans.quiet_call("on_new_request", parent, notify, request)

    def may_load_async(self, request: Any) -> bool:
        """vLLM 0.34's question on each arrival (--max-num-inflight-kv-loads), untraced: the
        wrapped connector's answer. Written out, since the generated forwarders follow the
        installed vLLM: the wrapper's API is then one on every supported release."""
        return cast("LoadsAsync", self._inner).may_load_async(request)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        with self._request_hook("get_num_new_matched_tokens", request) as span:
            result = self._inner.get_num_new_matched_tokens(request, num_computed_tokens)
            span.set_attributes(lookup_attributes(num_computed_tokens, result))
            return result

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int):
        with self._request_hook("get_external_cache_hit_sources", request) as span:
            result = self._inner.get_external_cache_hit_sources(request, num_external_tokens)
            span.set_attribute(
                names.HOOK_RESULT, short_text({str(k): v for k, v in result.items()})
            )
            return result

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        with self._request_hook(
            "update_state_after_alloc",
            request,
            **{names.TOKENS_TO_LOAD: num_external_tokens, **vllm_cached_attributes(request)},
        ) as span:
            if num_external_tokens > 0:
                self._sched.note_load(str(request.request_id))
                span.set_attributes(allocated_blocks_attributes(blocks))
            return self._inner.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        """The inner connector's metadata, carrying this step's trace (traces.metadata)."""
        new_reqs = scheduler_output.scheduled_new_reqs
        new_ids = [r.req_id for r in new_reqs] if new_reqs else []  # a decode step: no frame
        contexts, loads, links = self._sched.begin_step(
            scheduler_output.num_scheduled_tokens, new_ids
        )
        preempted = frozenset(scheduler_output.preempted_req_ids or ())
        # A step with no KV work (decode only, or idle): its hooks are counted, not traced;
        # whatever a connector reports in it still gets a span (quiet_call).
        if not (contexts or loads or preempted) and not self._trace_quiet_hooks:
            build = self._inner.build_connector_meta
            inner = self._spans.quiet_call("build_connector_meta", None, build, scheduler_output)
            return carry(inner, TracedMetadata(None, self._sched.step, quiet=True))
        with self._spans.hook(
            "build_connector_meta",
            None,
            links,
            **{
                names.STEP: self._sched.step,
                names.REQUEST_IDS: sorted(contexts),
                names.REQUEST_IDS_PREEMPTED: sorted(preempted),
                names.TOKENS_SCHEDULED: scheduler_output.total_num_scheduled_tokens,
            },
        ):
            inner = self._inner.build_connector_meta(scheduler_output)
            trace = TracedMetadata(None, self._sched.step, contexts, loads, preempted)
            return carry(inner, trace)

    def update_connector_output(self, connector_output: Any) -> None:
        sending = connector_output.finished_sending or set()
        recving = connector_output.finished_recving or set()
        invalid = connector_output.invalid_block_ids or set()
        worker_meta = connector_output.kv_connector_worker_meta
        if not (sending or recving or invalid or worker_meta) and not self._trace_quiet_hooks:
            update = self._inner.update_connector_output
            return self._spans.quiet_call("update_connector_output", None, update, connector_output)
        self._sched.note_loaded(set(recving))
        failed = getattr(connector_output, "failed_recving", None) or set()
        self._sched.transfers_done(sending, recving, failed)
        with self._spans.hook(
            "update_connector_output",
            None,
            **finished_attributes(sending, recving),
            **{
                names.LOAD_ERROR_BLOCK_IDS: sorted(invalid)[:256],
                names.FAILED_RECVING: sorted(failed),
            },
        ):
            return self._inner.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]):
        call = self._inner.request_finished
        return self._finished(request, block_ids, call, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]):
        if self._inner_supports_hma:
            assert isinstance(self._inner, SupportsHMA)  # what _inner_supports_hma says
            all_groups = self._inner.request_finished_all_groups
            return self._finished(request, block_ids[0], all_groups, block_ids, len(block_ids))
        if len(block_ids) != 1:  # vLLM enabled HMA for a class that is SupportsHMA: us
            raise RuntimeError(
                f"{type(self._inner).__name__} is not SupportsHMA and got {len(block_ids)} KV "
                "cache groups: start vLLM with --disable-hybrid-kv-cache-manager"
            )
        call = self._inner.request_finished
        return self._finished(request, block_ids[0], call, block_ids[0])

    def _finished(
        self, request: Any, first_group: list[int], call: Any, block_ids: Any, group_count: int = 1
    ):
        """One request_finished span, whichever of the two vLLM called (one event: the request
        ended; KV_CACHE_GROUP_COUNT tells them apart); call gets block_ids."""
        ids = block_ids_attributes(names.BLOCK_IDS, first_group)
        with self._request_hook("request_finished", request, **ids) as span:
            delay_free, params = call(request, block_ids)
            span.set_attributes(
                {
                    names.REQUEST_DELAY_FREE: bool(delay_free),
                    names.HOOK_RESULT: short_text(sorted(params) if params else None),
                    names.KV_CACHE_GROUP_COUNT: group_count,
                }
            )
        status = getattr(request, "status", None)
        self._sched.end_request(
            str(request.request_id),
            status=str(getattr(status, "name", status) or "finished"),
            **{names.REQUEST_DELAY_FREE: bool(delay_free)},
        )
        return delay_free, params

    def take_events(self):
        if "take_events" in self._untraced:
            return self._inner.take_events()
        events = list(self._inner.take_events())
        if events or self._trace_quiet_hooks:
            with self._spans.hook("take_events", None, **{names.EVENTS_COUNT: len(events)}):
                pass
        return events

    def reset_cache(self) -> bool | None:
        with self._spans.hook("reset_cache") as span:
            result = self._inner.reset_cache()
            span.set_attribute(names.HOOK_RESULT, short_text(result))
            return result

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        self._kv_cache_manager = kv_cache_manager
        self._inner.bind_kv_cache_manager(kv_cache_manager)


def allocated_blocks_attributes(blocks: Any) -> dict[str, Any]:
    """The blocks of update_state_after_alloc: with several KV cache groups those of every group,
    each named by KV_CACHE_GROUP_IDS (block ids are addresses within a group)."""
    groups = blocks.get_block_ids() if hasattr(blocks, "get_block_ids") else None
    if not isinstance(groups, tuple) or len(groups) < 2:
        return block_ids_attributes(names.BLOCK_IDS, kv_blocks_ids(blocks))
    ids = [block_id for group in groups for block_id in group]
    group_ids = [group_id for group_id, group in enumerate(groups) for _ in group]
    return {**block_ids_attributes(names.BLOCK_IDS, ids), names.KV_CACHE_GROUP_IDS: group_ids}


def vllm_cached_attributes(request: Any) -> dict[str, int]:
    """vLLM's own count of a request's cached prompt tokens, local and external, set just
    before update_state_after_alloc at its first scheduling (none after a preemption)."""
    stats = getattr(request, "prefill_stats", None)
    if stats is None or getattr(request, "num_preemptions", 0) > 0:
        return {}
    try:
        return {
            names.TOKENS_VLLM_LOCAL_CACHED: int(stats.num_local_cached_tokens),
            names.TOKENS_VLLM_EXTERNAL_CACHED: int(stats.num_external_cached_tokens),
        }
    except (AttributeError, TypeError, ValueError):
        return {}
