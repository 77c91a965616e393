"""Span names: what each kvscope span covers (hook spans are SPAN_HOOK_PREFIX + the hook)."""

from typing import Final

SPAN_REQUEST: Final = "kvscope.request"
"""One request's life in one engine's scheduler: parent of its scheduler hook spans."""

SPAN_HOOK_PREFIX: Final = "kvscope.hook."
"""Prefix of hook spans; the full name is SPAN_HOOK_PREFIX + the connector method's name."""

SPAN_STEP: Final = "kvscope.step"
"""One engine step on a worker: parent of that step's worker hook spans, linked to its requests."""

SPAN_WORKER_REQUEST: Final = "kvscope.worker.request"
"""A request's KV work in one worker step (in the request's trace): load, layers, save."""

SPAN_REQUEST_EVENT: Final = "kvscope.request.event"
"""A short span in a request's trace for a fact seen outside its own spans (e.g. load done)."""

SPAN_TRANSFER: Final = "kvscope.transfer"
"""One block transfer (host copy or network read) with its bytes and duration."""

SPAN_HANDSHAKE: Final = "kvscope.handshake"
"""The first contact with a peer engine over the side channel."""

SPAN_TELEMETRY: Final = "kvscope.telemetry"
"""Periodic self-report of the tracing pipeline: spans emitted and dropped so far."""

SPAN_TIER_HEALTH: Final = "kvscope.tier.health"
"""A KV tier (offload pool, P2P peer) changed health state (TIER_STATE): a root span, emitted
by the scheduler half when the tier is bypassed, probed or healthy again."""
