"""Judges one scenario run: tokens against the oracle, leaks, the span rules, failed loads."""

from typing import Any

from kvscope.harness.engine import BLOCK_SIZE
from kvscope.traces import names
from kvscope.verify import rules
from kvscope.verify.hooklog import LoadFacts, hook_calls, load_facts
from kvscope.verify.rules import Violation
from kvscope.verify.scenarios import Drive
from kvscope.verify.span_checks import all_span_checks, external_id

Oracle = dict[tuple[tuple[int, ...], int], list[int]]
"""Greedy tokens without a connector, by (prompt, max_tokens)."""


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class History:
    """Every token sequence the connector was given in this run: it can hold KV for no other."""

    def __init__(self) -> None:
        self.sequences: list[tuple[int, ...]] = []

    def bounds(self, prompts: tuple[tuple[int, ...], ...]) -> list[int]:
        """Per prompt: its longest prefix among earlier sequences and the other prompts."""
        bounds = []
        for i, prompt in enumerate(prompts):
            others = [p for j, p in enumerate(prompts) if j != i] + self.sequences
            bounds.append(max((common_prefix(prompt, seq) for seq in others), default=0))
        return bounds

    def add(self, drive_batch: tuple) -> None:
        wave, ids, batch = drive_batch
        for req_id, prompt in zip(ids, wave.prompts, strict=True):
            done = batch.results.get(req_id)
            self.sequences.append(prompt + tuple(done.tokens if done else ()))


def judge(
    drive: Drive,
    spans: list[Any],
    leaks: list[str],
    oracle: Oracle,
    bound_of: dict[str, int],
    connector: str,
) -> list[Violation]:
    calls = hook_calls(spans, connector)
    facts = load_facts(calls, BLOCK_SIZE, hook_calls(spans))
    failed = {external_id(req_id) for req_id, fact in facts.items() if fact.failed}
    found = all_span_checks(calls, facts, bound_of, settled=not drive.ended)
    found += token_checks(drive, oracle, failed)
    found += failed_load_checks(drive, oracle, facts)
    found += [Violation(rules.BLOCKS_RELEASED, leak) for leak in leaks]
    if drive.shutdown_error:
        found.append(Violation(rules.SHUTDOWN_CLEAN, drive.shutdown_error))
    return found


def token_checks(drive: Drive, oracle: Oracle, failed: set[str]) -> list[Violation]:
    """Requests without a failed load: the oracle's tokens, finished by length."""
    found = []
    for wave, ids, batch in drive.batches:
        for req_id, prompt in zip(ids, wave.prompts, strict=True):
            done = batch.results.get(req_id)
            if done is None or req_id in failed:
                continue
            want = oracle[(prompt, wave.max_tokens)]
            if done.finish_reason != "length":
                found.append(
                    Violation(
                        rules.TOKENS_MATCH,
                        f"ended with finish reason {done.finish_reason!r}, no load failed",
                        request=req_id,
                    )
                )
            elif done.tokens != want:
                at = common_prefix(tuple(want), tuple(done.tokens))
                got = done.tokens[at] if at < len(done.tokens) else "missing"
                found.append(
                    Violation(
                        rules.TOKENS_MATCH,
                        f"token {at} is {got}, the oracle's "
                        f"is {want[at] if at < len(want) else 'none'}",
                        request=req_id,
                    )
                )
    return found


def failed_load_checks(drive: Drive, oracle: Oracle, facts: dict[str, LoadFacts]):
    """A request whose load failed: recomputed (oracle tokens) or ended in error, per policy."""
    found, failed = [], {external_id(r): fact for r, fact in facts.items() if fact.failed}
    for wave, ids, batch in drive.batches:
        for req_id, prompt in zip(ids, wave.prompts, strict=True):
            done, fact = batch.results.get(req_id), failed.get(req_id)
            if done is None or fact is None:
                continue
            blocks = tuple(sorted(fact.error_blocks))
            if drive.scenario.policy == "fail" and done.finish_reason != "error":
                found.append(
                    Violation(
                        rules.FAILED_LOAD_OUTCOME,
                        f"load failed under policy fail, yet it ended by {done.finish_reason!r}",
                        fact.evidence,
                        req_id,
                        blocks,
                    )
                )
            elif drive.scenario.policy != "fail" and (
                done.finish_reason != "length" or done.tokens != oracle[(prompt, wave.max_tokens)]
            ):
                found.append(
                    Violation(
                        rules.FAILED_LOAD_OUTCOME,
                        "load failed under policy "
                        "recompute, and its tokens are not the oracle's "
                        f"(finish reason {done.finish_reason!r})",
                        fact.evidence,
                        req_id,
                        blocks,
                    )
                )
    return found


def load_notes(spans: list[Any], connector: str) -> list[str]:
    """What the connector did, for the report: hits, loads, failed loads."""
    calls = hook_calls(spans, connector)
    facts = load_facts(calls, BLOCK_SIZE, hook_calls(spans))
    hits = sum(
        1
        for c in calls
        if c.hook == "get_num_new_matched_tokens"
        and int(c.attrs.get(names.TOKENS_EXTERNAL_HIT) or 0) > 0
    )
    loads = sum(1 for fact in facts.values() if fact.load_blocks)
    failed = sum(1 for fact in facts.values() if fact.failed)
    return [f"{hits} external hits, {loads} loads, {failed} failed"]
