"""Samples the resident memory of each service's process tree while the soak runs."""

import contextlib
import threading
import time
from dataclasses import dataclass, field

import psutil

MIB = 2**20


def tree_rss(pid: int) -> int:
    """Bytes resident in a process and all its descendants (vLLM's engine core is a child)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


@dataclass
class MemoryTrack:
    """(seconds since start, bytes) samples of one service."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        """Start, peak and end in MiB, and growth over the second half of the run."""
        if not self.samples:
            return {"start": 0.0, "peak": 0.0, "end": 0.0, "growth_2nd_half": 0.0}
        half_t = self.samples[-1][0] / 2
        at_half = next(rss for t, rss in self.samples if t >= half_t)
        second_half_peak = max(rss for t, rss in self.samples if t >= half_t)
        return {
            "start": self.samples[0][1] / MIB,
            "peak": max(rss for _, rss in self.samples) / MIB,
            "end": self.samples[-1][1] / MIB,
            "growth_2nd_half": (second_half_peak - at_half) / MIB,
        }


class MemorySampler:
    """A background thread sampling every interval_s until stop()."""

    def __init__(self, pids: dict[str, int], interval_s: float = 2.0) -> None:
        self.pids = pids
        self.interval_s = interval_s
        self.tracks = {name: MemoryTrack() for name in pids}
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True, name="soak-rss")

    def start(self) -> "MemorySampler":
        self._started = time.monotonic()
        self._thread.start()
        return self

    def sample(self) -> None:
        now = time.monotonic() - self._started
        for name, pid in self.pids.items():
            self.tracks[name].samples.append((now, tree_rss(pid)))

    def latest_mib(self) -> dict[str, float]:
        return {n: t.samples[-1][1] / MIB for n, t in self.tracks.items() if t.samples}

    def stop(self) -> dict[str, dict[str, float]]:
        self._stop.set()
        self._thread.join(10)
        self.sample()
        return {name: track.summary() for name, track in self.tracks.items()}

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)
