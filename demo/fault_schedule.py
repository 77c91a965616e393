"""Injects faults on a schedule by rewriting the file the offload connectors re-read."""

import json
from dataclasses import dataclass
from pathlib import Path

SCHEDULE: tuple[tuple[float, str, dict], ...] = (
    (0.00, "no faults", {}),
    (0.25, "failing half the loads", {"fail_load_probability": 0.5, "seed": 7}),
    (0.45, "no faults", {}),
    (0.60, "loads slower than the load timeout", {"load_delay_ms": 1500.0}),
    (0.75, "evicting leased blocks", {"evict_leased": True}),
    (0.90, "no faults", {}),
)
"""(fraction of the run, what, fault plan): the plan in force from that point on."""


@dataclass
class FaultSchedule:
    path: Path
    enabled: bool = True
    _current: int = -1

    def update(self, fraction_done: float) -> str | None:
        """Writes the plan for this point of the run; returns its name when it changed."""
        if not self.enabled:
            return None
        index = max(i for i, (start, _, _) in enumerate(SCHEDULE) if start <= fraction_done)
        if index == self._current:
            return None
        self._current = index
        _, name, plan = SCHEDULE[index]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(plan))
        tmp.replace(self.path)  # atomic: a connector never reads half a file
        return name
