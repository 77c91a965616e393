"""Completed requests per second in each phase of the fault schedule, and faulted over clean."""

import time
from dataclasses import dataclass

from kvscope.demo.fault_schedule import SCHEDULE

FAULTED = next(name for _, name, plan in SCHEDULE if plan.get("load_delay_ms"))
"""The schedule's phase of loads slower than their timeout (the sick tier)."""


@dataclass
class Phase:
    name: str
    started: float
    ended: float | None = None
    completed: int = 0

    @property
    def req_per_s(self) -> float:
        seconds = (self.ended or time.monotonic()) - self.started
        return self.completed / seconds if seconds > 0 else 0.0


class PhaseRates:
    """Times each phase of the run by the wall clock and counts the requests completed in it
    (a request counts in the phase it ended in)."""

    def __init__(self) -> None:
        self.phases: list[Phase] = []

    def enter(self, name: str) -> None:
        now = time.monotonic()
        if self.phases:
            self.phases[-1].ended = now
        self.phases.append(Phase(name, now))

    def count_completed(self) -> None:
        if self.phases:
            self.phases[-1].completed += 1

    def end(self) -> None:
        if self.phases and self.phases[-1].ended is None:
            self.phases[-1].ended = time.monotonic()

    def faulted_and_clean(self) -> tuple[Phase, Phase] | None:
        """The sick-tier phase and the clean phase right before it (side by side in one run,
        after the same warm-up); None when the run had no such pair (faults off)."""
        for index, phase in enumerate(self.phases):
            if phase.name == FAULTED and index > 0 and self.phases[index - 1].name == "no faults":
                return phase, self.phases[index - 1]
        return None

    def faulted_over_clean(self) -> float | None:
        """Completed req/s with loads slower than their timeout over the clean phase before."""
        if (pair := self.faulted_and_clean()) is None:
            return None
        faulted, clean = pair
        return faulted.req_per_s / clean.req_per_s if clean.req_per_s else 0.0

    def lines(self) -> list[str]:
        return [
            f"{p.name:40s} {p.completed:6d} completed in {(p.ended or 0) - p.started:6.1f} s"
            f" = {p.req_per_s:6.2f} req/s"
            for p in self.phases
        ]

    def to_dict(self) -> list[dict]:
        return [
            {
                "name": p.name,
                "completed": p.completed,
                "seconds": (p.ended or 0) - p.started,
                "req_per_s": p.req_per_s,
            }
            for p in self.phases
        ]
