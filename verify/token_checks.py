"""The 'tokens add up' rule: a request's lookup, local hit + external hit, is what vLLM counted
cached when it scheduled the request (its PrefillStats: vllm:prompt_tokens_by_source)."""

from kvscope.traces import names
from kvscope.verify import rules
from kvscope.verify.hooklog import HookCall, by_request
from kvscope.verify.rules import Violation

_LOOKUP = "get_num_new_matched_tokens"
_ALLOC = "update_state_after_alloc"


def tokens_add_up(calls: list[HookCall]) -> list[Violation]:
    """Per request: vLLM's count at its first scheduling (the allocation that carries it)
    against the last decided lookup before it; prompt = local + external + computed holds
    only if the connector's hits are the tokens vLLM took as cached."""
    found = []
    for req_id, own in by_request(calls).items():
        lookup: HookCall | None = None
        for call in own:
            if call.hook == _LOOKUP and names.TOKENS_EXTERNAL_HIT in call.attrs:
                lookup = call
            elif call.hook == _ALLOC and names.TOKENS_VLLM_LOCAL_CACHED in call.attrs:
                if lookup is not None and (broken := _mismatch(lookup, call)):
                    found.append(Violation(rules.TOKENS_ADD_UP, broken, call.label, req_id))
                break
    return found


def _mismatch(lookup: HookCall, alloc: HookCall) -> str:
    local = int(lookup.attrs.get(names.TOKENS_LOCAL_HIT, 0))
    external = int(lookup.attrs.get(names.TOKENS_EXTERNAL_HIT) or 0)
    vllm_local = int(alloc.attrs.get(names.TOKENS_VLLM_LOCAL_CACHED, 0))
    vllm_external = int(alloc.attrs.get(names.TOKENS_VLLM_EXTERNAL_CACHED, 0))
    if (local, external) == (vllm_local, vllm_external):
        return ""
    return (
        f"the lookup ({lookup.label}) reported {local} local + {external} external tokens; "
        f"vLLM counted {vllm_local} + {vllm_external} cached when it scheduled the request"
    )
