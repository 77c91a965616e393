"""The contract rules read from the hook spans of one scenario."""

from kvscope.traces import names
from kvscope.verify import rules
from kvscope.verify.hooklog import HookCall, LoadFacts, by_request
from kvscope.verify.rules import Violation
from kvscope.verify.token_checks import tokens_add_up

REQUEST_HOOKS = ("get_num_new_matched_tokens", "update_state_after_alloc", "request_finished")


def external_id(req_id: str) -> str:
    """Our request id: vLLM appends '-<random suffix>' to the id a request was added with."""
    return req_id.rsplit("-", 1)[0]


def hook_errors(calls: list[HookCall]) -> list[Violation]:
    return [
        Violation(rules.HOOK_RAISED, call.error, call.label, call.req_id)
        for call in calls
        if call.error
    ]


def finished_sending(calls: list[HookCall]) -> list[Violation]:
    """request_finished True, then the request in some later finished_sending."""
    found = []
    for i, call in enumerate(calls):
        if call.hook != "request_finished" or not call.attrs.get(names.REQUEST_DELAY_FREE):
            continue
        later = (c for c in calls[i + 1 :] if c.hook == "update_connector_output")
        if not any(call.req_id in c.strs(names.FINISHED_SENDING) for c in later):
            found.append(
                Violation(
                    rules.FINISHED_SENDING,
                    "request_finished returned True; the request never came in finished_sending",
                    call.label,
                    call.req_id,
                    tuple(call.ids(names.BLOCK_IDS)),
                )
            )
    return found


def async_loads_end(facts: dict[str, LoadFacts]) -> list[Violation]:
    return [
        Violation(
            rules.ASYNC_LOAD_ENDS,
            "async load never in finished_recving nor failed",
            fact.evidence,
            req_id,
            tuple(fact.load_blocks),
        )
        for req_id, fact in facts.items()
        if fact.async_load and fact.load_blocks and not (fact.finished_recving or fact.failed)
    ]


def lookups_repeat(calls: list[HookCall]) -> list[Violation]:
    """Two lookups of a request at the same computed tokens, nothing allocated in between."""
    found = []
    for req_id, own in by_request(calls).items():
        last: HookCall | None = None
        for call in own:
            if call.hook == "update_state_after_alloc":
                last = None
            if call.hook != "get_num_new_matched_tokens":
                continue
            if call.attrs.get(names.TOKENS_EXTERNAL_PENDING):
                continue  # 'ask me again later' is a legal first answer
            if last is not None and _answer(last) != _answer(call) and _local(last) == _local(call):
                found.append(
                    Violation(
                        rules.LOOKUP_REPEATABLE,
                        f"answered {_answer(last)} then {_answer(call)} at "
                        f"{_local(call)} computed tokens",
                        call.label,
                        req_id,
                    )
                )
            last = call
    return found


def _answer(call: HookCall) -> tuple:
    return (call.attrs.get(names.TOKENS_EXTERNAL_HIT), bool(call.attrs.get(names.LOAD_ASYNC)))


def _local(call: HookCall) -> int:
    return int(call.attrs.get(names.TOKENS_LOCAL_HIT, 0))


def claims_bounded(calls: list[HookCall], bound_of: dict[str, int]) -> list[Violation]:
    """A request's first lookup claims at most the longest prefix it shares with what the
    connector was given (bound_of, by our request id); later lookups (after a preemption)
    may also use the request's own stored tokens."""
    found = []
    for req_id, own in by_request(calls).items():
        first = next(
            (
                c
                for c in own
                if c.hook == "get_num_new_matched_tokens"
                and not c.attrs.get(names.TOKENS_EXTERNAL_PENDING)
            ),
            None,
        )
        bound = bound_of.get(external_id(req_id))
        if first is None or bound is None:
            continue
        hit = int(first.attrs.get(names.TOKENS_EXTERNAL_HIT) or 0)
        if hit > 0 and _local(first) + hit > max(bound, _local(first)):
            found.append(
                Violation(
                    rules.CLAIMS_BOUNDED,
                    f"claimed {hit} tokens after {_local(first)} computed; "
                    f"only {bound} tokens of its prompt were ever given to the connector",
                    first.label,
                    req_id,
                )
            )
    return found


def load_errors_disjoint(facts: dict[str, LoadFacts]) -> list[Violation]:
    return [
        Violation(
            rules.LOAD_ERROR_DISJOINT,
            "blocks reported both loaded and failed",
            fact.evidence,
            req_id,
            tuple(sorted(both)),
        )
        for req_id, fact in facts.items()
        if (both := fact.error_blocks & fact.loaded_blocks)
    ]


def hook_order(calls: list[HookCall]) -> list[Violation]:
    found = []
    for req_id, own in by_request(calls).items():
        looked_up, finished = False, None
        for call in own:
            if call.hook not in REQUEST_HOOKS:
                continue
            if finished is not None:
                found.append(
                    Violation(
                        rules.HOOK_ORDER,
                        f"{call.hook} after request_finished ({finished.label})",
                        call.label,
                        req_id,
                    )
                )
                break
            if call.hook == "update_state_after_alloc" and not looked_up:
                found.append(
                    Violation(
                        rules.HOOK_ORDER,
                        "update_state_after_alloc before any get_num_new_matched_tokens",
                        call.label,
                        req_id,
                    )
                )
            looked_up |= call.hook == "get_num_new_matched_tokens"
            if call.hook == "request_finished":
                finished = call
    return found


def all_span_checks(
    calls: list[HookCall],
    facts: dict[str, LoadFacts],
    bound_of: dict[str, int],
    settled: bool = True,
) -> list[Violation]:
    """Every span rule; those about what must come later only once the engine settled."""
    found = hook_errors(calls) + lookups_repeat(calls) + claims_bounded(calls, bound_of)
    found += load_errors_disjoint(facts) + hook_order(calls) + tokens_add_up(calls)
    if settled:
        found += finished_sending(calls) + async_loads_end(facts)
    return found
