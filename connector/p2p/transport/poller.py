"""A progress thread that runs only while its owner has something to progress, else sleeps."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)


@dataclass
class PollerStats:
    """How often the poller ran; idle CPU is the product of these and a step's cost."""

    steps: int = 0
    busy_steps: int = 0  # steps after which the poller slept less than a second
    step_errors: int = 0


class ProgressPoller:
    """Runs `step()` in a daemon thread; each step says how long to sleep before the next one.

    NIXL's own progress thread spins a whole core even when idle, so the transport turns it off;
    then transfers advance only while someone polls the agent. This thread is that someone.
    `step()` returns the seconds until the next step, or None to sleep until `wake()`: the
    transport asks for fast steps only while reads are in flight or expected, so an idle agent
    costs nothing but an occasional heartbeat. `keep_hot()` asks for fast steps for a while
    regardless (a peer is connecting, a notification is still being sent).
    """

    def __init__(
        self,
        step: Callable[[], float | None],
        hot_interval_s: float = 0.001,
        error_retry_s: float = 0.05,
        name: str = "kvscope-p2p-poller",
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """`on_start` runs first on the thread (e.g. sets the CUDA device, cuda_threads)."""
        self._step = step
        self._on_start = on_start
        self._hot_interval_s = hot_interval_s
        self._error_retry_s = error_retry_s
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._hot_until = 0.0  # monotonic time before which the poller stays fast
        self.stats = PollerStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run a step now (new work arrived); the step then sets the pace."""
        self._wake.set()

    def keep_hot(self, seconds: float) -> None:
        """Poll fast for at least `seconds` more, e.g. while a peer may be connecting or reading."""
        self._hot_until = max(self._hot_until, time.monotonic() + seconds)
        self._wake.set()

    @property
    def is_hot(self) -> bool:
        return time.monotonic() < self._hot_until

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stopped.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        while not self._stopped.is_set():
            self._wake.clear()  # before the step: a wake() during the step is not lost
            delay = self._safe_step()
            if self.is_hot:
                delay = self._hot_interval_s if delay is None else min(delay, self._hot_interval_s)
            self.stats.steps += 1
            self.stats.busy_steps += delay is not None and delay < 1.0
            self._wake.wait(delay)

    def _safe_step(self) -> float | None:
        try:
            return self._step()
        except Exception:  # the thread must outlive any bug in a step, or transfers hang
            self.stats.step_errors += 1
            if self.stats.step_errors <= 10:
                logger.exception("p2p progress step failed (it keeps running)")
            return self._error_retry_s
