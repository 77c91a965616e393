"""Runs one bench as a subprocess with a timeout, its output in a log, its figures recorded."""

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.bench.common.results import RESULTS_ENV, load
from kvscope.bench.report.benches import BenchSpec, bench_missing, supported_args

PROGRESS_EVERY_S = 30.0
LEFTOVER_GRACE_S = 5.0
"""How long a finished bench's other processes may take to exit (an engine process still
shutting down) before they count as left behind and are killed."""


@dataclass
class BenchRun:
    """How one bench went: status is "ok", "failed", "timed out" or "not run"."""

    name: str
    argv: list[str]
    status: str = "not run"
    returncode: int | None = None
    seconds: float = 0.0
    started_at: float = 0.0  # time.time() when it started
    timeout_s: float = 0.0
    log_path: Path | None = None
    reason: str = ""
    dropped_flags: list[str] = field(default_factory=list)
    load_start: float = float("nan")
    load_end: float = float("nan")
    figures: list[dict] = field(default_factory=list)

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None or not self.log_path.exists():
            return self.reason
        text = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])


def _last_line(log_path: Path) -> str:
    with contextlib.suppress(OSError), log_path.open("rb") as log:
        log.seek(max(0, log_path.stat().st_size - 400))
        lines = [x for x in log.read().decode(errors="replace").splitlines() if x.strip()]
        return lines[-1][:120] if lines else ""
    return ""


def _kill_group(process: subprocess.Popen, first: signal.Signals) -> bool:
    """Signals the bench's process group (its leader's pid); True if it still had processes."""
    try:
        os.killpg(process.pid, first)
    except ProcessLookupError:
        return False
    if first != signal.SIGKILL and not _group_gone(process, 10):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    return True


def _group_gone(process: subprocess.Popen, timeout_s: float) -> bool:
    """Whether the bench's process group empties within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        process.poll()  # reaps the leader: a zombie still counts as a group member
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _wait(process: subprocess.Popen, spec_name: str, timeout_s: float, log_path: Path) -> bool:
    """Waits for the bench, printing progress; False when it ran past its timeout."""
    started = time.monotonic()
    while True:
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            return False
        try:
            process.wait(timeout=min(PROGRESS_EVERY_S, left))
            return True
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            print(
                f"  {spec_name}: {elapsed:.0f} s of at most {timeout_s:.0f} s | "
                f"{_last_line(log_path)}",
                flush=True,
            )


def run_bench(
    spec: BenchSpec, quick: bool, results_path: Path, logs_dir: Path, timeout_factor: float = 1.0
) -> BenchRun:
    """Runs a bench to its end or its timeout; a failure is described, never raised."""
    args, dropped = supported_args(spec, spec.quick_args if quick else spec.full_args)
    run = BenchRun(spec.name, [*spec.command, *args], dropped_flags=dropped)
    run.timeout_s = spec.timeout_s(quick) * timeout_factor
    missing = bench_missing(spec)
    if missing:
        run.reason = missing
        return run
    logs_dir.mkdir(parents=True, exist_ok=True)
    run.log_path = logs_dir / f"{spec.name}.log"
    already = len(load(results_path))
    env = {**os.environ, RESULTS_ENV: str(results_path.resolve()), "PYTHONUNBUFFERED": "1"}
    run.load_start = os.getloadavg()[0]
    run.started_at = time.time()
    started = time.monotonic()
    with run.log_path.open("w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(run.argv)}\n")
        log.flush()
        # A session of its own: on timeout the whole tree (vLLM servers too) is killed.
        process = subprocess.Popen(
            run.argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            finished = _wait(process, spec.name, run.timeout_s, run.log_path)
        except BaseException:  # Ctrl-C: its own session would not get the signal
            _kill_group(process, signal.SIGTERM)
            raise
        if not finished:
            _kill_group(process, signal.SIGTERM)
            process.wait(timeout=30)
        leftovers = (
            finished
            and not _group_gone(process, LEFTOVER_GRACE_S)
            and _kill_group(process, signal.SIGKILL)
        )
    run.seconds = time.monotonic() - started
    run.load_end = os.getloadavg()[0]
    run.returncode = process.returncode
    run.figures = load(results_path)[already:]
    if not finished:
        run.status, run.reason = "timed out", f"ran past its {run.timeout_s:.0f} s timeout"
    elif process.returncode != 0:
        run.status, run.reason = "failed", f"exit status {process.returncode}"
    else:
        run.status = "ok"
    if leftovers:
        run.reason += ("; " if run.reason else "") + "left processes behind (killed)"
    return run
