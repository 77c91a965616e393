"""Span event names and the request timeline points they and the hook spans mark."""

from typing import Final

# --- Span events ------------------------------------------------------------------------------

EVENT_LEASE_ACQUIRED: Final = "kvscope.lease.acquired"
"""A lease was taken on blocks a lookup counted."""

EVENT_LEASE_RELEASED: Final = "kvscope.lease.released"
"""A lease was released (load done, request finished or aborted)."""

EVENT_LEASE_EXPIRED: Final = "kvscope.lease.expired"
"""A lease expired before it was released: a failure."""

EVENT_BLOCK_STORED: Final = "kvscope.block.stored"
"""Blocks were committed to a tier (their data is final)."""

EVENT_BLOCK_EVICTED: Final = "kvscope.block.evicted"
"""Blocks were evicted from a tier."""

EVENT_BLOCK_LOOKED_UP: Final = "kvscope.block.looked_up"
"""A lookup asked a tier for these blocks, in order (what-if sizing replays them)."""

EVENT_BLOCK_LOADED: Final = "kvscope.block.loaded"
"""Blocks were loaded into the engine's KV cache."""

EVENT_EVICTION_REFUSED: Final = "kvscope.block.eviction_refused"
"""An eviction was refused because the blocks were leased."""

EVENT_LOAD_FAILED: Final = "kvscope.load.failed"
"""A load failed; FAILURE_CAUSE and FAILURE_POLICY say why and what follows."""

EVENT_TIMELINE: Final = "kvscope.timeline"
"""A request timeline point; TIMELINE_POINT names it."""

TIMELINE_POINT: Final = "kvscope.timeline.point"
"""Name of a timeline point, one of TIMELINE_POINTS."""


# --- Request timeline -------------------------------------------------------------------------

TIMELINE_POINTS: Final = (
    "lookup_start",  # start of the first get_num_new_matched_tokens span
    "lookup_result",  # end of the last get_num_new_matched_tokens span (TOKENS_EXTERNAL_HIT)
    "blocks_allocated",  # end of update_state_after_alloc with TOKENS_TO_LOAD > 0
    "transfer_submitted",  # EVENT_TIMELINE on SPAN_WORKER_REQUEST at start_load_kv
    "layer_ready",  # EVENT_TIMELINE per layer on SPAN_WORKER_REQUEST (wait_for_layer_load)
    "forward_start",  # EVENT_TIMELINE on SPAN_WORKER_REQUEST at the first per-layer hook
    "transfer_complete",  # SPAN_REQUEST_EVENT when the scheduler gets FINISHED_RECVING
    "resumed",  # EVENT_TIMELINE on SPAN_REQUEST when first scheduled after its load
    "finished",  # end of the request_finished hook span
)
"""The KV timeline points of a request, in their usual order, and where each is read from."""


# --- Load convoys -----------------------------------------------------------------------------

LOAD_CONVOY_POINT: Final = "load_convoy"
"""A timeline point on a SPAN_REQUEST_EVENT spanning the wait of a load that queued behind
another request's load of the same host blocks (connector/cpu_offload/convoys.py): the point
is the load's submission, the span's end the start of its copy. Not in TIMELINE_POINTS, which
every request is expected to show: most requests never wait so."""
