"""A progress thread that polls every millisecond while busy and sleeps when idle."""

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
    busy_steps: int = 0
    step_errors: int = 0


class ProgressPoller:
    """Runs `step()` in a daemon thread: fast while it reports work or is kept hot, slow otherwise.

    NIXL's own progress thread spins a whole core even when idle, so the transport turns it off;
    then transfers advance only while someone polls the agent. This thread is that someone: it
    sleeps `busy_interval_s` between steps while transfers are in flight or reads are expected,
    and `idle_interval_s` otherwise, so an idle agent costs a few wake-ups a second.
    """

    def __init__(
        self,
        step: Callable[[], bool],
        busy_interval_s: float = 0.001,
        idle_interval_s: float = 0.02,
        name: str = "kvscope-p2p-poller",
    ) -> None:
        self._step = step
        self._busy_interval_s = busy_interval_s
        self._idle_interval_s = idle_interval_s
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._hot_until = 0.0  # monotonic time before which the poller stays fast
        self.stats = PollerStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Run a step now (new work arrived)."""
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
        while not self._stopped.is_set():
            busy = self._safe_step()
            self.stats.steps += 1
            self.stats.busy_steps += busy
            interval = self._busy_interval_s if busy or self.is_hot else self._idle_interval_s
            self._wake.wait(interval)
            self._wake.clear()

    def _safe_step(self) -> bool:
        try:
            return bool(self._step())
        except Exception:  # the thread must outlive any bug in a step, or transfers hang
            self.stats.step_errors += 1
            if self.stats.step_errors <= 10:
                logger.exception("p2p progress step failed (it keeps running)")
            return False
