"""What a failed load became, for kvscope.failure.outcome: vLLM's kv_load_failure_policy decides."""

RECOMPUTED = "recomputed"
FAILED = "failed"
SERVED_BY_FALLBACK = "served_by_fallback"
KEPT_PINNED = "kept_pinned"  # a lease ran out during its load: the blocks stay until it ends
RELEASED = "released"  # a lease ran out before its load: the hit is given up


def outcome_of_policy(policy: str | None) -> str:
    """'failed' under kv_load_failure_policy 'fail', else 'recomputed' (vLLM's default)."""
    return FAILED if policy == "fail" else RECOMPUTED
