"""The matrix's three checks on one cell's record: outcome (tokens or error), leaks, backend."""

import re
import time
from dataclasses import dataclass, field

from kvscope.harness.backend_process import BackendProcess
from kvscope.harness.oracle import token_mismatches
from tests.reliability.cases import Case
from tests.reliability.engine_ops import Batch

LOSSY_FAULTS = ("backend_down", "queue_full")
"""Faults that lose spans on purpose: their requests' rows are not looked for on the backend."""

PROMPT_FAILURE_S = 10.0
"""'Fails promptly': every timeout the engines run with is 3 s or less; 10 s covers a busy CI."""


@dataclass
class CellRun:
    """What one cell did and left behind, recorded right after it ran."""

    case: Case
    batch: Batch
    start_ns: int
    end_ns: int = 0
    leaks: list[str] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # backend rows of this cell
    requests: list[dict] = field(default_factory=list)  # backend request rows of this cell
    active_leases: list[dict] = field(default_factory=list)  # backend leases still held
    dropped: dict[str, int] = field(default_factory=dict)  # export counters during the cell
    stream: dict | None = None  # this process's span stream on the backend, after the cell


def check_outcome(run: CellRun, expected: dict[str, list[int]]) -> None:
    """'tokens': the oracle's tokens; 'error': a prompt failure. Aborted ones are not judged."""
    case, results = run.case, run.batch.results
    assert results, f"no request of {case.id} finished: {run.batch}"
    if case.expect == "tokens":
        wanted = [expected[req_id] for req_id in results]
        got = [result.tokens for result in results.values()]
        mismatches = token_mismatches(wanted, got)
        assert mismatches == [], "\n".join(mismatches)
        reasons = {req_id: r.finish_reason for req_id, r in results.items()}
        assert set(reasons.values()) == {"length"}, reasons
    else:
        reasons = {req_id: r.finish_reason for req_id, r in results.items()}
        assert set(reasons.values()) == {"error"}, f"expected every request to fail: {reasons}"
        slowest = max(r.elapsed_s for r in results.values())
        assert slowest < PROMPT_FAILURE_S, f"a request took {slowest:.1f} s to fail"
    if case.fault == "preempted":
        assert run.batch.preemptions > 0, "vLLM preempted nothing: the cell tested nothing"
    if case.fault == "aborted":
        assert run.batch.aborted, "nothing was aborted mid-transfer"


def check_leaks(run: CellRun) -> None:
    assert run.leaks == [], "\n".join(run.leaks)


def check_backend(run: CellRun) -> None:
    """The backend shows what happened: the failure with cause and outcome, the abort, the
    preempted requests finished, or the spans lost while it was down or behind."""
    case = run.case
    if case.cause is not None:
        causes = [row["cause"] for row in run.failures]
        assert any(re.search(case.cause, cause or "") for cause in causes), causes
        outcomes = [(row["cause"], row["outcome"]) for row in run.failures]
        assert any(row["outcome"] == case.outcome for row in run.failures), outcomes
    elif case.fault in LOSSY_FAULTS:
        kind = "dropped_export_failed" if case.fault == "backend_down" else "dropped_queue_full"
        assert run.dropped.get(kind, 0) > 0, f"no span was {kind}: {run.dropped}"
        assert run.stream is not None and run.stream["status"] == "lossy", run.stream
        assert run.stream["telemetry_dropped"] >= run.dropped[kind], run.stream
    else:
        assert run.failures == [], f"a failure was recorded where none happened: {run.failures}"
    if case.fault not in LOSSY_FAULTS:
        assert not any(run.dropped.values()), f"spans were lost in this cell: {run.dropped}"
    statuses = {row["request_id"].rsplit("-", 1)[0]: row["status"] for row in run.requests}
    for req_id in [*run.batch.results, *run.batch.aborted]:
        want = "finished_aborted" if req_id in run.batch.aborted else None
        if case.fault in LOSSY_FAULTS:
            continue  # their spans were lost on purpose
        assert req_id in statuses, f"the backend has no request {req_id}: {statuses}"
        assert statuses[req_id] != "running", statuses
        assert want is None or statuses[req_id] == want, statuses
    unexplained = [lease for lease in run.active_leases if not lease_explained(case, lease)]
    assert unexplained == [], "the backend still shows leases held by this cell"


def lease_explained(case: Case, lease: dict) -> bool:
    """A lease the backend cannot see end is fine if it says why: its holder's process died
    (overdue: past its timeout, no end seen), or spans of that process were lost (uncertain)."""
    if case.fault == "peer_killed":
        return lease["overdue"]
    return case.fault in LOSSY_FAULTS and not lease["certain"]


def wait_for_backend(backend: BackendProcess, run: CellRun, timeout_s: float = 15.0) -> None:
    """Reads the backend into run, waiting until what the cell expects has arrived (a failure
    row with its cause; its outcome may come on a row of its own, so that gets 2 s more)."""
    case, prefix = run.case, run.case.id
    deadline = time.monotonic() + timeout_s
    while True:
        run.failures = backend.failures(run.start_ns, run.end_ns, prefix)
        run.requests = backend.requests(prefix, run.start_ns)
        run.active_leases = [
            lease for lease in backend.active_leases() if (lease["holder"] or "").startswith(prefix)
        ]
        done = [row for row in run.requests if row["status"] != "running"]
        want_rows = len(run.batch.results) + len(run.batch.aborted)
        if case.fault in LOSSY_FAULTS:
            want_rows = 0  # their requests' spans were lost on purpose: none will come
        caused = case.cause is None or any(
            re.search(case.cause, row["cause"] or "") for row in run.failures
        )
        leases_ok = all(lease_explained(case, lease) for lease in run.active_leases)
        # A killed peer's lease reads overdue only once its timeout (PEER_LEASE_S) has passed:
        # keep the whole wait for that, and cut it short only once the leases are explained.
        if caused and case.cause is not None and leases_ok:
            deadline = min(deadline, time.monotonic() + 2.0)
        arrived = case.cause is None or any(row["outcome"] == case.outcome for row in run.failures)
        complete = caused and arrived and len(done) >= want_rows and leases_ok
        if complete or time.monotonic() > deadline:
            return
        time.sleep(0.3)
