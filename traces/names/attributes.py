"""Attribute keys of kvscope spans, events and resources, by what they describe."""

from typing import Final

# --- Resource and process attributes ----------------------------------------------------------

SCHEMA: Final = "kvscope.schema.version"
"""SCHEMA_VERSION of the process that emitted the span."""

SEQ: Final = "kvscope.seq"
"""Per-process sequence number of each span, from 0 in end order (the order spans are
exported in, so a span open for minutes leaves no hole): a hole means lost spans."""

SEQ_ORIGIN: Final = "kvscope.seq.origin"
"""Unique id of the process start whose SEQ counter numbered the span: gaps are per origin."""

PROCESS_ID: Final = "service.instance.id"
"""Unique id of one process start (OTel semantic convention), equal to SEQ_ORIGIN where
kvscope created the tracer provider (not when it joined one vLLM had set up)."""


# --- Connector, engine, request, step ---------------------------------------------------------

CONNECTOR_NAME: Final = "kvscope.connector.name"
"""Class name of the connector whose hook ran (the wrapped one for TracedConnector)."""

CONNECTOR_ROLE: Final = "kvscope.connector.role"
"""'scheduler' or 'worker': which half of the connector ran the hook."""

CONNECTOR_CHILD: Final = "kvscope.connector.child"
"""Within a MultiConnector: the child connector a span or fact belongs to."""

ENGINE_ID: Final = "kvscope.engine.id"
"""vLLM's kv_transfer_config.engine_id of the engine."""

KV_ROLE: Final = "kvscope.engine.kv_role"
"""vLLM's kv_role of the engine: kv_producer, kv_consumer or kv_both."""

REQUEST_ID: Final = "gen_ai.request.id"
"""vLLM's request id (the name vLLM's own tracing uses)."""

REQUEST_IDS: Final = "kvscope.request.ids"
"""Request ids a step-level span served."""

REQUEST_IDS_PREEMPTED: Final = "kvscope.request.ids_preempted"
"""On build_connector_meta: the requests vLLM preempted in this step."""

PROMPT_TOKENS: Final = "gen_ai.usage.prompt_tokens"
"""Prompt length in tokens (the name vLLM's own tracing uses)."""

STEP: Final = "kvscope.step.index"
"""Index of the engine step (counted by the scheduler half, carried to workers in metadata)."""

REQUEST_STATUS: Final = "kvscope.request.status"
"""How the request ended, as vLLM's RequestStatus names it (FINISHED_STOPPED, ...)."""

REQUEST_DELAY_FREE: Final = "kvscope.request.delay_free"
"""True when the connector kept the request's blocks after it finished (async save or send)."""

LOAD_THIS_STEP: Final = "kvscope.load.this_step"
"""On SPAN_WORKER_REQUEST: the request loads external KV in this step."""

STEP_QUIET_HOOKS: Final = "kvscope.step.quiet_hooks"
"""Per-step hooks that ran without a span of their own (they returned nothing)."""

STEP_QUIET_BEFORE: Final = "kvscope.step.quiet_before"
"""Engine steps without KV work (decode-only or idle, so untraced) since the last traced step."""

KV_CACHE_BYTES: Final = "kvscope.kv_cache.bytes"
"""Total bytes of the engine's KV cache tensors (register_kv_caches)."""

KV_CACHE_LAYER_SHAPE: Final = "kvscope.kv_cache.layer_shape"
"""Shape and dtype of one layer's KV cache tensor (register_kv_caches)."""

EVENTS_COUNT: Final = "kvscope.events.count"
"""KV cache events a connector handed to vLLM (take_events)."""

LOAD_OUTCOME: Final = "kvscope.load.outcome"
"""On a transfer_complete request event: 'ok' or 'failed'."""

FAILED_RECVING: Final = "kvscope.failed.recving"
"""Request ids whose asynchronous load failed."""

HOOK: Final = "kvscope.hook"
"""Name of the KV connector method a span covers."""

HOOK_RESULT: Final = "kvscope.hook.result"
"""Short text form of a hook's return value."""


# --- Tokens -----------------------------------------------------------------------------------

TOKENS_LOCAL_HIT: Final = "kvscope.tokens.local_hit"
"""Tokens already computed locally (vLLM's prefix cache) when the connector was asked."""

TOKENS_EXTERNAL_HIT: Final = "kvscope.tokens.external_hit"
"""Tokens the connector can load beyond the local hit (None while it is still deciding)."""

TOKENS_EXTERNAL_PENDING: Final = "kvscope.tokens.external_pending"
"""True when the connector needs more time to decide and will be asked again."""

LOAD_ASYNC: Final = "kvscope.load.async"
"""True when the external tokens load asynchronously, between scheduler steps."""

TOKENS_TO_LOAD: Final = "kvscope.tokens.to_load"
"""num_external_tokens given to update_state_after_alloc: tokens the load must fill."""

TOKENS_SCHEDULED: Final = "kvscope.tokens.scheduled"
"""Tokens the scheduler scheduled in the step."""

TOKENS_VLLM_LOCAL_CACHED: Final = "kvscope.tokens.vllm_local_cached"
"""On update_state_after_alloc of a request's first scheduling: the prefix-cache tokens vLLM
itself counts for it (its PrefillStats, what vllm:prompt_tokens_by_source adds up)."""

TOKENS_VLLM_EXTERNAL_CACHED: Final = "kvscope.tokens.vllm_external_cached"
"""As TOKENS_VLLM_LOCAL_CACHED: the external (connector) tokens vLLM counts for it."""


# --- Lookups: why blocks missed (backend/queries/misses/) -----------------------------------

BLOCK_CONTENT_HASHES: Final = "kvscope.blocks.content_hashes"
"""On a looked_up event, pairwise with BLOCK_HASHES: a hash of the prompt's tokens up to and
including each block, without vLLM's extra keys (cache salt, LoRA adapter, multimodal inputs).
One content hash under two block hashes: the same tokens were stored under another key."""

LOOKUP_FIRST_MISS_STATE: Final = "kvscope.lookup.first_miss_state"
"""On a looked_up event: the host pool's state of the first block asked and not hit, 'writing'
(a store was still copying it) or 'absent'; unset when every block asked was hit."""

LOOKUP_SKIPPED: Final = "kvscope.lookup.skipped"
"""On a lookup span that asked no tier: why, 'tier_bypassed' (the tier's loads kept failing)."""


# --- Blocks, layers ---------------------------------------------------------------------------

BLOCK_IDS: Final = "kvscope.blocks.ids"
"""Local block ids (addresses in this engine's KV cache)."""

BLOCK_HASHES: Final = "kvscope.blocks.hashes"
"""Block content hashes, compact: the first 8 bytes in hex."""

BLOCK_COUNT: Final = "kvscope.blocks.count"
"""How many blocks the span or event concerns."""

BLOCK_SIZE: Final = "kvscope.block.size"
"""Tokens per block of the engine that emitted it."""

HOST_POOL_BLOCKS: Final = "kvscope.host_pool.blocks"
"""How many blocks the host pool holds in all (its size)."""

BLOCK_TIER: Final = "kvscope.block.tier"
"""Where a block lives: 'device', 'host' or 'remote'."""

HOST_BLOCK_IDS: Final = "kvscope.host_blocks.ids"
"""Host pool block ids (addresses in the CPU offload pool)."""

LOAD_ERROR_BLOCK_IDS: Final = "kvscope.load_errors.block_ids"
"""Local block ids whose load failed (get_block_ids_with_load_errors)."""

FINISHED_SENDING: Final = "kvscope.finished.sending"
"""Request ids whose asynchronous save or send finished."""

FINISHED_RECVING: Final = "kvscope.finished.recving"
"""Request ids whose asynchronous load finished."""

LAYER_NAME: Final = "kvscope.layer.name"
"""Attention layer name, as vLLM names it."""

LAYER_INDEX: Final = "kvscope.layer.index"
"""Attention layer position in the step's call order."""

LAYER_COUNT: Final = "kvscope.layer.count"
"""Per-layer calls aggregated into one span."""

LAYER_DURATIONS_MS: Final = "kvscope.layer.durations_ms"
"""Per-layer durations in milliseconds, in call order (aggregated mode)."""

LAYER_TOTAL_MS: Final = "kvscope.layer.total_ms"
"""Sum of the per-layer durations in milliseconds (aggregated mode)."""


# --- Transfers --------------------------------------------------------------------------------

TRANSFER_DIRECTION: Final = "kvscope.transfer.direction"
"""'store' (device to host), 'load' (host to device) or 'p2p_read' (remote to local)."""

TRANSFER_BYTES: Final = "kvscope.transfer.bytes"
"""Bytes the transfer moved."""

TRANSFER_DURATION_MS: Final = "kvscope.transfer.duration_ms"
"""Wall time of the transfer in milliseconds."""

TRANSFER_GBPS: Final = "kvscope.transfer.gbps"
"""Throughput of the transfer in GB/s (1e9 bytes per second)."""

TRANSFER_PEER: Final = "kvscope.transfer.peer"
"""The other side: a peer engine id, or 'host' for the offload pool."""

TRANSFER_DESCRIPTORS: Final = "kvscope.transfer.descriptors"
"""Memory descriptors in the transfer (blocks times layers for a NIXL read)."""

TRANSFER_OK: Final = "kvscope.transfer.ok"
"""False when the transfer failed."""


# --- Transport: what NIXL and UCX really used for a P2P read ----------------------------------

TRANSPORT_BACKEND: Final = "kvscope.transport.backend"
"""The NIXL backend that ran the read, as NIXL's query_xfer_backend says ('UCX'), or 'unknown'."""

TRANSPORT_UCX_LANES: Final = "kvscope.transport.ucx_lanes"
"""UCX transport/device pairs UCX selected for the read's bytes (['cma/memory']); [] if unknown."""

TRANSPORT_UCX_CONTROL_LANES: Final = "kvscope.transport.ucx_control_lanes"
"""UCX transport/device pairs of NIXL's notifications (UCX active messages, e.g. ['tcp/lo'])."""

TRANSPORT_UCX_SCOPE: Final = "kvscope.transport.ucx_scope"
"""UCX's endpoint scope: 'intra-node' (peer on this host), 'inter-node', or 'unknown'."""

TRANSPORT_MEMORY: Final = "kvscope.transport.memory"
"""NIXL memory kind on both sides of the read: 'DRAM' (host) or 'VRAM' (GPU)."""

TRANSPORT_WINDOW: Final = "kvscope.transport.window"
"""Which one window the read's bytes and time share: 'post_to_done' (post .. first seen DONE)."""

TRANSPORT_NIXL_BYTES: Final = "kvscope.transport.nixl_bytes"
"""Bytes NIXL's own telemetry counted for the read (equal to kvscope.transfer.bytes when right)."""

TRANSPORT_NIXL_XFER_US: Final = "kvscope.transport.nixl_xfer_us"
"""NIXL's own post-to-completion time of the read, in microseconds."""


# --- Leases -----------------------------------------------------------------------------------

LEASE_ID: Final = "kvscope.lease.id"
"""Id of a lease that pins blocks until a load completes."""

LEASE_TIMEOUT_S: Final = "kvscope.lease.timeout_s"
"""Seconds after which an unreleased lease expires."""

LEASE_OUTCOME: Final = "kvscope.lease.outcome"
"""How a lease ended: 'released', 'expired' or 'aborted'."""

LEASE_HOLDER: Final = "kvscope.lease.holder"
"""Request id holding the lease."""


# --- Load convoys (connector/cpu_offload/convoys.py) ------------------------------------------

CONVOY_LEADER: Final = "kvscope.convoy.leader"
"""On a load_convoy point: the request whose load of the same host blocks this one queued behind
(the first of them, when several were ahead)."""

CONVOY_LOADS_AHEAD: Final = "kvscope.convoy.loads_ahead"
"""On a load_convoy point: loads of some of the same host blocks still queued or copying when
this one was submitted."""

CONVOY_SHARED_BLOCKS: Final = "kvscope.convoy.shared_blocks"
"""On a load_convoy point: this load's host blocks that the loads ahead of it also read."""

CONVOY_WAIT_MS: Final = "kvscope.convoy.wait_ms"
"""On a load_convoy point: milliseconds from the load's submission to the start of its copy."""

CONVOY_SHARED_LOAD: Final = "kvscope.convoy.shared_load"
"""On a load_convoy point: true when the request was held back until the leader's load ended
and found the blocks in vLLM's prefix cache (no copy of its own); the wait ran from its first
lookup held back to the one let through."""


# --- Failures ---------------------------------------------------------------------------------

FAILURE_CAUSE: Final = "kvscope.failure.cause"
"""Why a load or transfer failed: 'load_error', 'timeout', 'peer_dead', 'lease_expired', ..."""

FAILURE_POLICY: Final = "kvscope.failure.policy"
"""vLLM's kv_load_failure_policy applied: 'recompute' or 'fail'."""

FAILURE_OUTCOME: Final = "kvscope.failure.outcome"
"""What became of the request or its hit: 'recomputed', 'failed' or 'served_by_fallback' after
a failed load; 'kept_pinned' (its blocks stay until the load ends) or 'released' (the hit is
given up) when a lease runs out (traces/outcomes.py)."""

FALLBACK_CHILD: Final = "kvscope.multi.fallback_child"
"""On a MultiConnector's load-failed event: the child that served the blocks instead."""


# --- Tracing pipeline self-report -------------------------------------------------------------

TRACE_MODE: Final = "kvscope.trace.layer_mode"
"""'aggregated' (one span per step for per-layer hooks) or 'per_layer'."""

SPANS_EMITTED: Final = "kvscope.telemetry.spans_emitted"
"""Spans this process has ended so far."""

SPANS_DROPPED: Final = "kvscope.telemetry.spans_dropped"
"""Spans this process has dropped so far (queue full or export failed)."""


# --- KV cache groups (vLLM's hybrid KV cache manager) ------------------------------------------

KV_CACHE_GROUP_IDS: Final = "kvscope.blocks.group_ids"
"""vLLM's KV cache group of each block, pairwise with HOST_BLOCK_IDS (or BLOCK_IDS): block ids
are addresses within one group and one block hash has a block in each group; all 0 for a model
with one group."""

KV_CACHE_GROUP_COUNT: Final = "kvscope.kv_cache_groups.count"
"""How many KV cache groups a request's blocks came in, on request_finished spans (which also
cover vLLM's request_finished_all_groups); 1 without vLLM's hybrid KV cache manager."""


# --- Tier health (connector/common/tier_health.py) --------------------------------------------

TIER: Final = "kvscope.tier"
"""On SPAN_TIER_HEALTH: which tier, e.g. 'cpu_offload'."""

TIER_STATE: Final = "kvscope.tier.state"
"""On SPAN_TIER_HEALTH: the state entered, 'healthy', 'bypassed' (lookups answer 0) or
'probing' (one lookup let through)."""

TIER_REASON: Final = "kvscope.tier.reason"
"""On SPAN_TIER_HEALTH: why the state changed, in words (e.g. the last failed load's cause)."""

TIER_FAILURES: Final = "kvscope.tier.failures"
"""On SPAN_TIER_HEALTH: loads failed or timed out in a row when the state changed."""

TIER_BYPASS_S: Final = "kvscope.tier.bypass_s"
"""On SPAN_TIER_HEALTH: seconds of the bypass begun (bypassed) or just over (probing); 0 when
healthy."""
