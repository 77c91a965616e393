"""The reasons a prompt token was not served from a tier, each with what it means."""

from typing import Final

LOCAL: Final = "local_prefix_cache"
PARTIAL: Final = "partial_block"
FIRST_SIGHT: Final = "first_sight"
DIVERGED: Final = "prefix_diverged"
OTHER_KEY: Final = "other_key"
EVICTED: Final = "evicted"
IN_FLIGHT: Final = "store_in_flight"
LEASE_EXPIRED: Final = "lease_expired"
LOAD_FAILED: Final = "load_failed"
BYPASSED: Final = "tier_bypassed"
NOT_OFFERED: Final = "not_offered"

REASONS: Final = {
    LOCAL: "vLLM's own prefix cache already held them: no tier was asked",
    PARTIAL: "below a whole block: the prompt's partial last block, and the block of its last "
    "token, which vLLM always computes",
    FIRST_SIGHT: "never stored: the prompt's first block missed, and nothing with its tokens "
    "was stored in the history read",
    DIVERGED: "the prompt's blocks before block k were known, and it differs from block k on "
    "(diverged_at_block)",
    OTHER_KEY: "the same tokens were stored under another block hash: another cache salt, "
    "LoRA adapter or multimodal input",
    EVICTED: "stored, then evicted before the lookup (the pool evicts only to make room: it "
    "was full); evicted_before_lookup_s says how long before",
    IN_FLIGHT: "a store was still copying the block when the lookup asked",
    LEASE_EXPIRED: "the request's lease on the block ran out before its load, and the block "
    "was evicted before the request asked again",
    LOAD_FAILED: "hit, but the load failed and vLLM recomputed them",
    BYPASSED: "the tier was bypassed (its loads kept failing): the lookup asked no tier",
    NOT_OFFERED: "the connector offered none and recorded no blocks that say why (another "
    "connector, a peer tier, or a lookup before block records)",
}
"""Every reason, in the order a prompt meets them; the reasons of a request add up to its
prompt tokens minus the tokens a tier served."""
