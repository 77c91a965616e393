"""Traced worker-side hooks: a step span per bound metadata, a span per hook, per-layer timings."""

import time
from typing import TYPE_CHECKING, Any, Final

from kvscope.traces import names
from kvscope.traces.attribute_values import (
    block_ids_attributes,
    finished_attributes,
    kv_caches_attributes,
    short_text,
)
from kvscope.traces.buffer import add_events
from kvscope.traces.metadata import trace_of
from kvscope.traces.outcomes import outcome_of_policy

STEP_HOOKS: Final = (
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_finished",
    "get_transfer_results",
    "get_kv_connector_stats",
    "get_kv_connector_kv_cache_events",
    "build_connector_worker_meta",
)
"""Hooks vLLM calls in every step between bind_connector_metadata and clear_connector_metadata,
which in a quiet step call the wrapped connector bare (each checks `_quiet_step` first): what
they return reaches the scheduler's update_connector_output, traced when it holds anything.
Load errors are not among them: their load_failed event must not wait for a step with work."""

if TYPE_CHECKING:
    from kvscope.traces.hook_host import ConnectorHost as _Host
else:
    _Host = object


class WorkerHooks(_Host):
    """Mixin for InstrumentedConnector: the hooks vLLM's model runner and attention layers call."""

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        with self._spans.hook("register_kv_caches", **kv_caches_attributes(kv_caches)):
            return self._inner.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        trace, connector_metadata = trace_of(connector_metadata)
        if trace is not None:
            # From a quiet step (no KV work: most decode steps) to the next step with work, the
            # STEP_HOOKS call the wrapped connector bare: a decode step then costs about what
            # it costs untraced; what the connector reports in it is kept for a step span
            # (WorkerTracing.begin_step).
            self._quiet_step = trace.quiet and not self._trace_quiet_hooks
            self._work.begin_step(trace)
        self._inner.bind_connector_metadata(connector_metadata)

    def unregister_kv_caches(self) -> None:
        """vLLM 0.33's sleep: drop KV cache registrations (a 0.32 connector has none to drop)."""
        self._sleep_hook("unregister_kv_caches")

    def restore_kv_caches(self) -> None:
        """vLLM 0.33's wake-up: register the KV caches again."""
        self._sleep_hook("restore_kv_caches")

    def _sleep_hook(self, hook: str) -> None:
        call = getattr(self._inner, hook, None)
        if call is None:  # written for vLLM 0.32: nothing to forward
            return
        with self._spans.hook(hook):
            call()

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self._inner.clear_connector_metadata()
        self._work.end_step()

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        trace, inner = trace_of(kv_connector_metadata)
        if "handle_preemptions" in self._untraced:
            return self._inner.handle_preemptions(inner)
        preempted = trace.reqs_preempted if trace is not None else None
        if preempted is not None and not preempted and not self._trace_quiet_hooks:
            self._work.note_quiet("handle_preemptions")
            handle = self._inner.handle_preemptions
            return self._spans.quiet_call("handle_preemptions", None, handle, inner)
        ids = {names.REQUEST_IDS: sorted(preempted or ())}
        with self._spans.hook("handle_preemptions", self._work.step_context, **ids):
            return self._inner.handle_preemptions(inner)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._quiet_step:
            return self._inner.start_load_kv(forward_context, **kwargs)
        if self._work.step_span is None and not self._trace_quiet_hooks:
            load = self._inner.start_load_kv  # an idle step
            return self._spans.quiet_call("start_load_kv", None, load, forward_context, **kwargs)
        loading = sorted(self._work.loading)
        with self._spans.hook(
            "start_load_kv", self._work.step_context, **{names.REQUEST_IDS: loading}
        ):
            self._work.timeline("transfer_submitted", loading)
            return self._inner.start_load_kv(forward_context, **kwargs)

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._quiet_step or (self._work.step_span is None and not self._trace_quiet_hooks):
            return self._inner.wait_for_layer_load(layer_name)  # a step without KV work
        if self._work.per_layer:
            with self._spans.hook(
                "wait_for_layer_load", self._work.step_context, **{names.LAYER_NAME: layer_name}
            ):
                self._inner.wait_for_layer_load(layer_name)
        else:
            start = time.time_ns()
            self._inner.wait_for_layer_load(layer_name)
            self._work.layer_call("wait_for_layer_load", layer_name, start, time.time_ns())
        self._work.timeline("layer_ready", self._work.loading, **{names.LAYER_NAME: layer_name})

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs) -> None:
        if self._quiet_step or (self._work.step_span is None and not self._trace_quiet_hooks):
            return self._inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        if self._work.per_layer:
            with self._spans.hook(
                "save_kv_layer", self._work.step_context, **{names.LAYER_NAME: layer_name}
            ):
                return self._inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        start = time.time_ns()
        self._inner.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
        self._work.layer_call("save_kv_layer", layer_name, start, time.time_ns())

    def wait_for_save(self) -> None:
        if self._quiet_step:
            return self._inner.wait_for_save()
        if self._work.step_span is None and not self._trace_quiet_hooks:
            return self._spans.quiet_call("wait_for_save", None, self._inner.wait_for_save)
        self._work.flush_layer_calls()
        with self._spans.hook("wait_for_save", self._work.step_context):
            return self._inner.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]):
        if self._quiet_step:
            return self._inner.get_finished(finished_req_ids)
        with self._spans.hook("get_finished", self._work.step_context) as span:
            sending, recving = self._inner.get_finished(finished_req_ids)
            span.set_attributes(finished_attributes(sending, recving))
        return sending, recving

    def get_transfer_results(self, finished_req_ids: set[str]):
        if self._quiet_step:
            return self._inner.get_transfer_results(finished_req_ids)
        start = time.time_ns()
        try:
            # Facts the connector reports land on the step span, or wait for a span of their own.
            call = self._inner.get_transfer_results
            results, events = self._work.call_in_step(call, finished_req_ids)
        except Exception:
            with self._spans.hook("get_transfer_results", self._work.step_context):
                raise  # recorded on the span, re-raised unchanged
        done = results.finished_sending or results.finished_recving or results.failed_recving
        if done or events or self._trace_quiet_hooks:
            span = self._spans.start(
                names.SPAN_HOOK_PREFIX + "get_transfer_results",
                self._work.step_context,
                start_time=start,
                **{names.HOOK: "get_transfer_results"},
                **finished_attributes(results.finished_sending, results.finished_recving),
            )
            span.set_attribute(names.FAILED_RECVING, sorted(results.failed_recving))
            add_events(span, events)
            span.end()
        else:
            self._work.note_quiet("get_transfer_results")
        return results

    # The per-step queries call the wrapped connector straight from here in a quiet step (or
    # when it keeps vLLM's no-op): a frame less than through _query, and in a running engine,
    # its caches cold from the forward, each frame costs about a microsecond.

    def get_block_ids_with_load_errors(self) -> set[int]:
        # Not a STEP_HOOK: a load failure is traced in a quiet step too.
        if "get_block_ids_with_load_errors" in self._untraced:
            return self._inner.get_block_ids_with_load_errors()
        return self._query("get_block_ids_with_load_errors", names.LOAD_ERROR_BLOCK_IDS)

    def get_kv_connector_stats(self):
        if self._quiet_step or "get_kv_connector_stats" in self._untraced:
            return self._inner.get_kv_connector_stats()
        return self._query("get_kv_connector_stats", names.HOOK_RESULT)

    def get_kv_connector_kv_cache_events(self):
        if self._quiet_step or "get_kv_connector_kv_cache_events" in self._untraced:
            return self._inner.get_kv_connector_kv_cache_events()
        return self._query("get_kv_connector_kv_cache_events", names.HOOK_RESULT)

    def build_connector_worker_meta(self):
        if self._quiet_step or "build_connector_worker_meta" in self._untraced:
            return self._inner.build_connector_worker_meta()
        return self._query("build_connector_worker_meta", names.HOOK_RESULT)

    def _query(self, hook: str, result_key: str):
        """A per-step query the hook did not answer bare: a span only when it returns something
        or reports facts (or quiet hooks are traced)."""
        start = time.time_ns()
        try:
            result, events = self._work.call_in_step(getattr(self._inner, hook))
        except Exception:
            with self._spans.hook(hook, self._work.step_context):
                raise  # recorded on the span, re-raised unchanged
        if result or events or self._trace_quiet_hooks:
            span = self._spans.start(
                names.SPAN_HOOK_PREFIX + hook,
                self._work.step_context,
                start_time=start,
                **{names.HOOK: hook},
            )
            if result_key == names.LOAD_ERROR_BLOCK_IDS and result:
                span.set_attributes(block_ids_attributes(result_key, sorted(result)))
                span.add_event(
                    names.EVENT_LOAD_FAILED,
                    {
                        names.FAILURE_CAUSE: "load_error",
                        names.FAILURE_POLICY: self._failure_policy,
                        names.FAILURE_OUTCOME: outcome_of_policy(self._failure_policy),
                        names.BLOCK_COUNT: len(result),
                    },
                )
            else:
                span.set_attribute(result_key, short_text(result))
            add_events(span, events)
            span.end()
        else:
            self._work.note_quiet(hook)
        return result
