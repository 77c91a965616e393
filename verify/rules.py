"""The contract rules verify checks, and what a broken rule reports: a violation with evidence."""

from dataclasses import dataclass, field

TOKENS_MATCH = "tokens_match"
BLOCKS_RELEASED = "blocks_released"
FINISHED_SENDING = "finished_sending_follows"
ASYNC_LOAD_ENDS = "async_load_ends"
LOOKUP_REPEATABLE = "lookup_repeatable"
CLAIMS_BOUNDED = "claims_bounded"
LOAD_ERROR_DISJOINT = "load_error_blocks_disjoint"
HOOK_ORDER = "hook_order"
HOOK_RAISED = "hook_raised"
FAILED_LOAD_OUTCOME = "failed_load_outcome"
SHUTDOWN_CLEAN = "shutdown_clean"
ENGINE_ERROR = "engine_error"
TOKENS_ADD_UP = "tokens_add_up"

RULES: dict[str, str] = {
    TOKENS_MATCH: "greedy tokens equal those of a run without the connector",
    BLOCKS_RELEASED: "no KV block is held after every request ended (vLLM's block pool and "
    "request table, and kvscope connectors' own state)",
    FINISHED_SENDING: "a request_finished that returned True (delay free) is followed by that "
    "request in finished_sending",
    ASYNC_LOAD_ENDS: "every async load ends in finished_recving or a load error",
    LOOKUP_REPEATABLE: "get_num_new_matched_tokens answers the same when asked again (same "
    "request, same computed tokens, nothing allocated in between)",
    CLAIMS_BOUNDED: "get_num_new_matched_tokens claims no token beyond the longest prefix that "
    "earlier requests of this run gave the connector",
    LOAD_ERROR_DISJOINT: "no block id is reported both in a load error and in a successful load",
    HOOK_ORDER: "hooks come in a legal order per request (lookup before allocation, nothing "
    "after request_finished, request_finished once)",
    HOOK_RAISED: "no hook raises",
    FAILED_LOAD_OUTCOME: "a failed load never ends in tokens computed from the bad blocks "
    "(policy recompute: oracle tokens; policy fail: the request ends in error)",
    SHUTDOWN_CLEAN: "the engine shuts down with work pending, promptly and without error",
    ENGINE_ERROR: "the engine starts and serves the scenario without raising",
    TOKENS_ADD_UP: "tokens add up: a request's lookup (local + external hit) is what vLLM "
    "counted cached when it scheduled it, so prefix-cache + external + computed = prompt",
}
"""Each rule and what it asserts, as the report prints it."""


@dataclass(frozen=True)
class Violation:
    """One broken rule and where it shows: a span (hook), a request, block ids, in words."""

    rule: str
    detail: str
    span: str = ""
    request: str = ""
    blocks: tuple[int, ...] = ()

    def evidence(self) -> str:
        parts = [self.detail]
        if self.span:
            parts.append(f"span {self.span}")
        if self.request:
            parts.append(f"request {self.request}")
        if self.blocks:
            parts.append(f"blocks {list(self.blocks)[:16]}")
        return "; ".join(parts)

    def to_dict(self) -> dict:
        return {
            "rule": self.rule,
            "contract": RULES.get(self.rule, ""),
            "detail": self.detail,
            "span": self.span,
            "request": self.request,
            "blocks": list(self.blocks),
        }


@dataclass
class ScenarioResult:
    """A scenario's verdict: pass, FAIL (violations) or skip (why), with notes on what ran."""

    scenario: str
    policy: str
    violations: list[Violation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: str = ""
    elapsed_s: float = 0.0

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "skip"
        return "FAIL" if self.violations else "pass"

    def to_dict(self) -> dict:
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "verdict": self.verdict,
            "violations": [v.to_dict() for v in self.violations],
            "notes": self.notes,
            "skipped": self.skipped,
            "elapsed_s": round(self.elapsed_s, 2),
        }
