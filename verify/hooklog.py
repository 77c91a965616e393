"""The traced hooks of a scenario, read back from TracedConnector's spans in call order."""

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from kvscope.traces import names


@dataclass(frozen=True)
class HookCall:
    """One hook span: which hook, for which request, its attributes and span events."""

    hook: str
    req_id: str
    attrs: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    start_ns: int
    span_id: str
    error: str = ""

    @property
    def label(self) -> str:
        return f"{names.SPAN_HOOK_PREFIX}{self.hook} {self.span_id}"

    def ids(self, key: str) -> list[int]:
        return [int(block_id) for block_id in self.attrs.get(key) or ()]

    def strs(self, key: str) -> list[str]:
        return [str(value) for value in self.attrs.get(key) or ()]


def hook_calls(spans: list[Any], connector: str | None = None) -> list[HookCall]:
    """Hook spans (names.SPAN_HOOK_PREFIX), oldest first; with connector, only the outermost
    wrapper's, whose spans name that class (a connector traced itself, or a Multi's children,
    have hook spans of their own inside them)."""
    calls = []
    for span in spans:
        if not span.name.startswith(names.SPAN_HOOK_PREFIX):
            continue
        attrs = dict(span.attributes or {})
        if connector is not None and (
            attrs.get(names.CONNECTOR_NAME) != connector or names.CONNECTOR_CHILD in attrs
        ):
            continue
        events = tuple((event.name, dict(event.attributes or {})) for event in span.events)
        error = span.status.description or "error" if not span.status.is_ok else ""
        calls.append(
            HookCall(
                span.name.removeprefix(names.SPAN_HOOK_PREFIX),
                str(attrs.get(names.REQUEST_ID, "")),
                attrs,
                events,
                span.start_time or 0,
                f"{span.context.span_id:016x}"[:8],
                error,
            )
        )
    return sorted(calls, key=lambda call: call.start_ns)


@dataclass
class LoadFacts:
    """What the spans say about one request's loads: its load blocks, errors and successes."""

    load_blocks: list[int] = field(default_factory=list)  # device blocks it was to load into
    async_load: bool = False
    finished_recving: bool = False
    failed: bool = False  # in failed_recving, or its blocks among a load error's
    error_blocks: set[int] = field(default_factory=set)
    loaded_blocks: set[int] = field(default_factory=set)  # kvscope.block.loaded events
    evidence: str = ""


def load_facts(
    calls: list[HookCall], block_size: int, reports: list[HookCall] | None = None
) -> dict[str, LoadFacts]:
    """Per request: the blocks each load was to fill and how each load ended (calls: the
    outermost hooks; reports: every hook span, whose events say what was loaded or failed)."""
    facts: dict[str, LoadFacts] = defaultdict(LoadFacts)
    local: dict[str, int] = {}
    asked_async: dict[str, bool] = {}
    for call in calls:
        if call.hook == "get_num_new_matched_tokens":
            local[call.req_id] = int(call.attrs.get(names.TOKENS_LOCAL_HIT, 0))
            asked_async[call.req_id] = bool(call.attrs.get(names.LOAD_ASYNC))
        elif call.hook == "update_state_after_alloc":
            to_load = int(call.attrs.get(names.TOKENS_TO_LOAD, 0))
            if to_load > 0:
                first = local.get(call.req_id, 0) // block_size
                last = -(-(local.get(call.req_id, 0) + to_load) // block_size)
                fact = facts[call.req_id]
                fact.load_blocks = call.ids(names.BLOCK_IDS)[first:last]
                fact.async_load = asked_async.get(call.req_id, False)
                fact.evidence = call.label
        elif call.hook == "update_connector_output":
            _note_output(call, facts)
    for call in calls if reports is None else reports:
        _note_events(call, facts)
    return dict(facts)


def _note_output(call: HookCall, facts: dict[str, LoadFacts]) -> None:
    invalid = set(call.ids(names.LOAD_ERROR_BLOCK_IDS))
    failed = set(call.strs(names.FAILED_RECVING))
    for req_id in call.strs(names.FINISHED_RECVING):
        facts[req_id].finished_recving = True
    for req_id, fact in facts.items():
        bad = invalid & set(fact.load_blocks)
        if bad or req_id in failed:
            fact.failed = True
            fact.error_blocks |= bad


def _note_events(call: HookCall, facts: dict[str, LoadFacts]) -> None:
    for name, attrs in call.events:
        req_id = str(attrs.get(names.REQUEST_ID, ""))
        if not req_id:
            continue
        ids = {int(block_id) for block_id in attrs.get(names.BLOCK_IDS) or ()}
        if name == names.EVENT_BLOCK_LOADED:
            facts[req_id].loaded_blocks |= ids
        elif name == names.EVENT_LOAD_FAILED:
            facts[req_id].failed = True
            facts[req_id].error_blocks |= ids


def by_request(calls: list[HookCall]) -> dict[str, list[HookCall]]:
    grouped: dict[str, list[HookCall]] = defaultdict(list)
    for call in calls:
        if call.req_id:
            grouped[call.req_id].append(call)
    return dict(grouped)
