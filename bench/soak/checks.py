"""The soak's checks: tokens against the reference, leaks once idle, every request ended."""

import time
from dataclasses import dataclass, field

from kvscope.bench.pd.pd_pair import metric
from kvscope.bench.soak.client import ABORTED, COMPLETED, FAILED, HUNG, Outcome
from kvscope.bench.soak.system import SERVERS, System


@dataclass
class CheckResult:
    name: str
    ok: bool
    figure: float  # the number the check is about (mismatches, leaks, hung, ...)
    details: list[str] = field(default_factory=list)


def token_mismatches(outcomes: list[Outcome], reference: dict[str, list[int]]) -> CheckResult:
    """Completed: exactly the reference's first max_tokens; aborted: a prefix of it."""
    problems = []
    for outcome in outcomes:
        if outcome.status not in (COMPLETED, ABORTED):
            continue
        want = reference[outcome.request.prompt][: outcome.request.max_tokens]
        got = outcome.tokens
        if outcome.status == ABORTED:
            want = want[: len(got)]
        if got != want:
            at = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
            problems.append(
                f"request {outcome.request.index} ({outcome.status}, "
                f"{outcome.request.route}): first difference at token {at}: "
                f"want {want}, got {got}"
            )
    return CheckResult("token mismatches", not problems, len(problems), problems)


def every_request_ended(outcomes: list[Outcome], planned: int, policy: str) -> CheckResult:
    """None hung; errors only where the 'fail' policy allows them, and each says why."""
    problems = [f"{planned - len(outcomes)} requests never ran"] if len(outcomes) != planned else []
    hung = [o for o in outcomes if o.status == HUNG]
    problems += [f"request {o.request.index} ({o.request.route}) hung: {o.error}" for o in hung]
    allowed = []
    for outcome in outcomes:
        if outcome.status != FAILED:
            continue
        line = f"request {outcome.request.index} ({outcome.request.route}) failed"
        if policy == "fail" and outcome.error:
            allowed.append(f"{line} (the 'fail' policy allows it): {outcome.error}")
        else:
            problems.append(f"{line} under '{policy}': {outcome.error or 'no error message'}")
    return CheckResult("hung requests", not problems, len(hung), problems + allowed)


def held_now(system: System, role: str) -> dict[str, int]:
    """What one server holds right now; every count is 0 on an idle server with no leak."""
    url = system.urls[role]
    state = system.connector_state(role)
    if state is None:
        return {"probe state unavailable": 1}
    try:
        queued = sum(
            metric(url, n) for n in ("vllm:num_requests_running", "vllm:num_requests_waiting")
        )
    except OSError:
        return {"metrics unreadable": 1}
    offload, p2p, multi = state.get("offload", {}), state.get("p2p", {}), state.get("multi", {})
    held = {
        "requests running or waiting": queued,
        "device blocks": state.get("device_blocks_used", 0),
        "offload leases": len(offload.get("leases", [])),
        "pinned host blocks": len(offload.get("pinned", [])),
        "host blocks being stored": offload.get("pending_blocks", 0),
        "offload requests tracked": offload.get("requests", 0),
        "p2p blocks held for a reader (leases)": len(p2p.get("held", {})),
        "p2p pulls in flight": len(p2p.get("pulling", [])),
        "p2p lookups pending": p2p.get("lookups", 0),
        "multi loads tracked": multi.get("loads", 0) + multi.get("serving", 0),
    }
    return {what: int(count) for what, count in held.items()}


def wait_until_idle(system: System, timeout_s: float) -> CheckResult:
    """Polls both servers until nothing is held; the leak count is what remains at timeout_s."""
    started = time.monotonic()
    while True:
        held = {role: held_now(system, role) for role in SERVERS}
        leaks = {(r, what): n for r, counts in held.items() for what, n in counts.items() if n}
        if not leaks or time.monotonic() - started > timeout_s:
            break
        time.sleep(1.0)
    waited = time.monotonic() - started
    details = [f"{role}: {what}: {n}" for (role, what), n in sorted(leaks.items())]
    details.append(
        f"idle after {waited:.0f} s" if not leaks else f"still held after {waited:.0f} s"
    )
    return CheckResult("leaks", not leaks, sum(leaks.values()), details)


def memory_bounded(memory: dict[str, dict[str, float]], max_growth_mib: float) -> CheckResult:
    """Growth over the second half of the run under max_growth_mib for every process."""
    grown = {
        n: m["growth_2nd_half"] for n, m in memory.items() if m["growth_2nd_half"] > max_growth_mib
    }
    details = [
        f"{name} grew {g:.0f} MiB in the second half (limit {max_growth_mib:.0f})"
        for name, g in grown.items()
    ]
    worst = max((m["growth_2nd_half"] for m in memory.values()), default=0.0)
    return CheckResult("max RSS growth MiB (2nd half)", not grown, worst, details)
