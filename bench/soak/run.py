"""Runs the soak end to end: system up, reference table, workload with faults, checks, table."""

import asyncio
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kvscope.bench.common.results import record
from kvscope.bench.soak.checks import (
    CheckResult,
    every_request_ended,
    held_now,
    memory_bounded,
    token_mismatches,
    wait_until_idle,
)
from kvscope.bench.soak.client import COMPLETED, Outcome, counts, run_plan
from kvscope.bench.soak.memory import MemorySampler
from kvscope.bench.soak.phases import PhaseRates
from kvscope.bench.soak.plan import REFERENCE_MAX_TOKENS, make_plan, unique_prompts
from kvscope.bench.soak.rebuilt import (
    backend_activity,
    lease_rows_match,
    rebuilt_state_matches,
)
from kvscope.bench.soak.reference import start_reference, wait_reference
from kvscope.bench.soak.system import SERVERS, start_system
from kvscope.demo.fault_schedule import FaultSchedule
from kvscope.demo.stack import Stack

BENCH = "soak"


@dataclass
class SoakOptions:
    model: Path
    requests: int = 2000
    concurrency: int = 4
    seed: int = 0
    abort_fraction: float = 0.1
    faults: bool = True
    policy: str = "recompute"  # vLLM's kv_load_failure_policy: "recompute" or "fail"
    request_timeout_s: float = 120.0
    idle_timeout_s: float = 60.0  # > the P2P lease (20 s): unread held blocks expire
    startup_timeout_s: float = 600.0
    max_rss_growth_mib: float = 256.0
    workdir: Path | None = None
    # vLLM's default executor on the servers (the model in a worker process of its own) instead
    # of kvscope's VLLM_ENABLE_V1_MULTIPROCESSING=0
    default_executor: bool = False
    tier_health: dict | None = None  # the offload pool's breaker settings; None: its defaults


def run_soak(options: SoakOptions) -> list[CheckResult]:
    """Every check's result; the system is stopped whatever happens."""
    workdir = options.workdir or Path(tempfile.mkdtemp(prefix="kvscope-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "faults.json").write_text("{}")
    print(f"kvscope soak: {options.requests} requests, logs and database in {workdir}", flush=True)
    soak_started = time.monotonic()
    plan = make_plan(options.requests, options.seed, options.abort_fraction)
    reference = start_reference(
        options.model, unique_prompts(plan), workdir, REFERENCE_MAX_TOKENS, options.concurrency
    )
    stack = Stack()
    try:
        system = start_system(
            options.model,
            workdir,
            stack,
            options.policy,
            options.startup_timeout_s,
            options.default_executor,
            options.tier_health,
        )
        phases = {"startup_s": time.monotonic() - soak_started}
        run = drive_and_check(options, system, plan, phases)
        table = wait_reference(*reference, timeout_s=options.startup_timeout_s)
    finally:
        stopping = time.monotonic()
        stack.stop()
        if reference[0].poll() is None:
            reference[0].kill()
    phases["stop_s"] = time.monotonic() - stopping
    outcomes, memory = run["outcomes"], run["memory"]
    results = [
        token_mismatches(outcomes, table),
        run["leaks"],
        every_request_ended(outcomes, len(plan), options.policy),
        run["rebuilt"],
        run["lease_rows"],
        memory_bounded(memory, options.max_rss_growth_mib),
    ]
    print_summary(outcomes, phases["workload_s"], memory, results, run["activity"])
    print_phase_rates(run["rates"])
    phases["total_s"] = time.monotonic() - soak_started
    print(
        f"\nsoak took {phases['total_s']:.0f} s in all: "
        + ", ".join(f"{name[:-2]} {s:.0f} s" for name, s in phases.items() if name != "total_s"),
        flush=True,
    )
    record_figures(outcomes, phases["workload_s"], memory, results)
    record_phase_rates(run["rates"])
    write_results(workdir / "soak_results.json", outcomes, phases, memory, results, run["rates"])
    return results


def drive_and_check(options: SoakOptions, system, plan, phases: dict) -> dict:
    """Runs the plan with the fault schedule, waits for idle, checks state while it is up."""
    sampler = MemorySampler({s.name: s.process.pid for s in system.stack.services}).start()
    faults = FaultSchedule(
        system.state_files["prefill"].parent / "faults.json", enabled=options.faults
    )
    peaks: dict[str, int] = {}
    rates = PhaseRates()
    if name := faults.update(0.0):
        rates.enter(name)
    started = time.monotonic()
    on_done = progress(options, faults, sampler, system, peaks, rates)
    outcomes = asyncio.run(
        run_plan(system.urls, plan, options.concurrency, options.request_timeout_s, on_done)
    )
    phases["workload_s"] = time.monotonic() - started
    rates.end()
    faults.update(1.0)  # the schedule ends with no faults
    system.stack.check_alive()
    leaks = wait_until_idle(system, options.idle_timeout_s)
    phases["idle_wait_s"] = time.monotonic() - started - phases["workload_s"]
    leaks.details += [f"peak while running: {what}: {n}" for what, n in peaks.items() if n]
    return {
        "outcomes": outcomes,
        "leaks": leaks,
        "rebuilt": rebuilt_state_matches(system),
        "lease_rows": lease_rows_match(system),
        "activity": backend_activity(system.urls["backend"], time.monotonic() - started + 60),
        "memory": sampler.stop(),
        "rates": rates,
    }


def progress(
    options: SoakOptions,
    faults: FaultSchedule,
    sampler: MemorySampler,
    system,
    peaks,
    rates: PhaseRates,
):
    """The per-request callback: moves the fault schedule along (timing each phase), prints a
    line every 10 s and keeps the peak of what the servers held (proof the leak check sees
    held state)."""
    started = time.monotonic()
    last = {"printed": started, "ended": {}}
    stack = system.stack

    def on_done(outcome: Outcome, done: int) -> None:
        last["ended"][outcome.status] = last["ended"].get(outcome.status, 0) + 1
        if outcome.status == COMPLETED:
            rates.count_completed()
        if name := faults.update(done / options.requests):
            rates.enter(name)
            print(f"[{time.monotonic() - started:6.0f} s] faults: {name}", flush=True)
        if time.monotonic() - last["printed"] >= 10 or done == options.requests:
            last["printed"] = time.monotonic()
            stack.check_alive()
            for role in SERVERS:
                for what, n in held_now(system, role).items():
                    peaks[f"{role}: {what}"] = max(n, peaks.get(f"{role}: {what}", 0))
            elapsed = time.monotonic() - started
            rss = ", ".join(f"{n} {m:.0f}" for n, m in sampler.latest_mib().items())
            print(
                f"[{elapsed:6.0f} s] {done}/{options.requests} ended {last['ended']}, "
                f"{done / elapsed:.2f} req/s; RSS MiB: {rss}",
                flush=True,
            )

    return on_done


def print_summary(
    outcomes, wall_s: float, memory: dict, results: list[CheckResult], activity: list[str]
) -> None:
    ended = counts(outcomes)
    rate = ended[COMPLETED] / wall_s if wall_s else 0.0
    print(
        f"\n{len(outcomes)} requests in {wall_s:.0f} s ({rate:.2f} completed/s): "
        + ", ".join(f"{n} {status}" for status, n in sorted(ended.items()))
    )
    print("\n".join(f"  {line}" for line in activity))
    print(f"\n{'process':10s} {'start':>8s} {'peak':>8s} {'end':>8s} {'2nd-half growth':>16s}  MiB")
    for name, m in memory.items():
        print(
            f"{name:10s} {m['start']:8.0f} {m['peak']:8.0f} {m['end']:8.0f} "
            f"{m['growth_2nd_half']:16.1f}"
        )
    print(f"\n{'check':32s} {'figure':>8s}  verdict")
    for result in results:
        print(f"{result.name:32s} {result.figure:8.0f}  {'ok' if result.ok else 'FAILED'}")
        for line in result.details[:20]:
            print(f"    {line}")
        if len(result.details) > 20:
            print(f"    ... {len(result.details) - 20} more")


def record_figures(outcomes, wall_s: float, memory: dict, results: list[CheckResult]) -> None:
    by_name = {result.name: result for result in results}
    record(BENCH, "token_mismatches", by_name["token mismatches"].figure, "count", "== 0")
    record(BENCH, "leaks", by_name["leaks"].figure, "count", "== 0")
    record(BENCH, "hung", by_name["hung requests"].figure, "count", "== 0")
    record(
        BENCH,
        "rebuilt_state_unexplained",
        by_name["rebuilt state differences"].figure,
        "count",
        "== 0",
    )
    record(
        BENCH,
        "leases_missing_in_backend",
        by_name["leases missing in the backend"].figure,
        "count",
        "== 0",
    )
    completed = counts(outcomes)[COMPLETED]
    record(
        BENCH,
        "requests_per_s",
        completed / wall_s if wall_s else 0.0,
        "req/s",
        note=f"{len(outcomes)} requests, {completed} completed",
    )
    for name, m in memory.items():
        record(BENCH, f"rss_growth_mib_{name}", m["growth_2nd_half"], "MiB", note="2nd half")


def print_phase_rates(rates: PhaseRates) -> None:
    if not rates.phases:
        return
    print("\ncompleted requests per fault phase:")
    print("\n".join(f"  {line}" for line in rates.lines()))
    if (ratio := rates.faulted_over_clean()) is not None:
        print(f"  faulted over clean: {ratio:.2f} (goal >= 0.5)")


def record_phase_rates(rates: PhaseRates) -> None:
    """soak_faulted_over_clean_req_per_s: loads slower than their timeout (a sick tier) over
    the clean phase right before, side by side in this run."""
    if (pair := rates.faulted_and_clean()) is None:
        return
    faulted, clean = pair
    ratio = rates.faulted_over_clean()
    note = (
        f"{faulted.completed} completed at {faulted.req_per_s:.2f}/s with loads slower "
        f"than their timeout, {clean.completed} at {clean.req_per_s:.2f}/s clean; load "
        f"average {os.getloadavg()[0]:.1f}"
    )
    record(BENCH, "faulted_over_clean_req_per_s", ratio, "ratio", ">= 0.5", note=note)
    record(BENCH, "faulted_req_per_s", faulted.req_per_s, "req/s", note=faulted.name)
    record(BENCH, "clean_req_per_s", clean.req_per_s, "req/s", note="the phase before")


def write_results(
    path: Path, outcomes, phases: dict, memory: dict, results: list, rates: PhaseRates
) -> None:
    """The figures as JSON, for tests and scripts."""
    checks = {r.name: {"ok": r.ok, "figure": r.figure, "details": r.details} for r in results}
    summary = {
        "requests": len(outcomes),
        "ended": dict(counts(outcomes)),
        "wall_s": phases["workload_s"],
        "phases_s": phases,
        "memory_mib": memory,
        "checks": checks,
        "fault_phases": rates.to_dict(),
        "faulted_over_clean_req_per_s": rates.faulted_over_clean(),
    }
    path.write_text(json.dumps(summary, indent=1))
