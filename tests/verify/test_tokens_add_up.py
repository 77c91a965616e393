"""The 'tokens add up' rule over hook calls as verify reads them from spans: a lookup whose hits
vLLM did not count as cached is named, with the request; a retried lookup is paired right."""

from kvscope.traces import names
from kvscope.verify import rules
from kvscope.verify.hooklog import HookCall
from kvscope.verify.span_checks import all_span_checks
from kvscope.verify.token_checks import tokens_add_up


def call(hook: str, at: int, req_id: str = "req-1", **attrs) -> HookCall:
    return HookCall(hook, req_id, {names.REQUEST_ID: req_id, **attrs}, (), at, f"{at:08x}")


def lookup(at: int, local: int, external: int | None, req_id: str = "req-1") -> HookCall:
    attrs = {names.TOKENS_LOCAL_HIT: local}
    if external is not None:
        attrs[names.TOKENS_EXTERNAL_HIT] = external
    return call("get_num_new_matched_tokens", at, req_id, **attrs)


def alloc(at: int, vllm_local: int | None, vllm_external: int, req_id: str = "req-1"):
    attrs = {names.TOKENS_TO_LOAD: vllm_external}
    if vllm_local is not None:
        attrs[names.TOKENS_VLLM_LOCAL_CACHED] = vllm_local
        attrs[names.TOKENS_VLLM_EXTERNAL_CACHED] = vllm_external
    return call("update_state_after_alloc", at, req_id, **attrs)


def test_counts_vllm_took_as_cached_pass():
    calls = [lookup(1, 0, None), lookup(2, 32, 64), alloc(3, 32, 64)]  # pending, then decided
    calls += [lookup(4, 0, 0, "req-2"), lookup(5, 32, 0, "req-2"), alloc(6, 32, 0, "req-2")]
    calls += [alloc(7, None, 0), lookup(8, 0, 96), alloc(9, 0, 96)]  # after a preemption
    assert tokens_add_up(calls) == []


def test_a_lookup_vllm_counted_otherwise_is_named_with_its_request():
    calls = [lookup(1, 32, 64, "req-over"), alloc(2, 32, 0, "req-over")]
    calls += [lookup(3, 0, 64), alloc(4, 0, 64)]
    (violation,) = tokens_add_up(calls)
    assert violation.rule == rules.TOKENS_ADD_UP and violation.request == "req-over"
    assert (
        "32 local + 64 external" in violation.detail and "vLLM counted 32 + 0" in violation.detail
    )
    assert violation in all_span_checks(calls, {}, {})
    assert "tokens add up" in rules.RULES[rules.TOKENS_ADD_UP]
