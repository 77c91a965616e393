"""The span a load convoy leaves in its request's trace: the wait, with a load_convoy point."""

from kvscope.connector.cpu_offload.convoys import LoadConvoy
from kvscope.traces import names
from kvscope.traces.context import context_of
from kvscope.traces.facts import monotonic_to_epoch_ns
from kvscope.traces.hook_spans import get_tracer


def convoy_recorded(convoy: LoadConvoy) -> None:
    """A SPAN_REQUEST_EVENT from the load's submission to the start of its copy (a shared
    load's: from the first lookup held back to the one let through); the backend takes its
    start as the request's load_convoy timeline point."""
    wait_s = max(convoy.copy_started_at - convoy.submitted_at, 0.0)
    start_ns = monotonic_to_epoch_ns(convoy.submitted_at)
    span = get_tracer().start_span(
        names.SPAN_REQUEST_EVENT,
        context=context_of(convoy.req_id),
        start_time=start_ns,
        attributes={
            names.REQUEST_ID: convoy.req_id,
            names.TIMELINE_POINT: names.LOAD_CONVOY_POINT,
            names.CONVOY_LEADER: convoy.leader_req_id,
            names.CONVOY_LOADS_AHEAD: convoy.loads_ahead,
            names.CONVOY_SHARED_BLOCKS: convoy.shared_blocks,
            names.CONVOY_WAIT_MS: wait_s * 1000,
            names.CONVOY_SHARED_LOAD: convoy.shared_load,
        },
    )
    span.end(end_time=start_ns + round(wait_s * 1e9))
