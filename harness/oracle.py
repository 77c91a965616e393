"""The correctness oracle: greedy tokens with a connector must equal greedy tokens without one."""

from collections.abc import Sequence
from typing import Any


def greedy_params(max_tokens: int = 16) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def greedy_tokens(llm: Any, prompts: Sequence[str], max_tokens: int = 16) -> list[list[int]]:
    """Generated token ids per prompt, in prompt order."""
    outputs = llm.generate(list(prompts), greedy_params(max_tokens), use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outputs]


def token_mismatches(expected: list[list[int]], actual: list[list[int]]) -> list[str]:
    """Human-readable differences; empty when the oracle holds."""
    problems = []
    if len(expected) != len(actual):
        problems.append(f"{len(expected)} outputs expected, got {len(actual)}")
    for i, (want, got) in enumerate(zip(expected, actual, strict=False)):
        if want != got:
            at = next((j for j, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), None)
            problems.append(f"prompt {i}: first difference at token {at}: {want} != {got}")
    return problems
