"""Sampling profiles of a bench's arms, taken side by side: one pyinstrument profiler per arm,
started around each of its batches only, so arms measured in one process compare frame by frame.

    profiles = ArmProfiles()                 # in the process that runs the batches
    with profiles.around("traced"):
        run_batch()
    profiles.write(directory, "engine")      # <engine>-<arm>.txt and .json per arm

`compare` reads two arms' .json back and lists the functions whose own time differs most:
where the one arm's extra time went. pyinstrument samples the thread that starts it (here the
engine's), so another thread's cost (the span export thread) shows as time its GIL took from
this one, spread over the frames that were waiting. For every thread of a process that runs
on its own (a backend being filled), `from_py_spy` turns py-spy's raw output into the same
summary, per second of sampling.
"""

import contextlib
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

_LINE = re.compile(r":\d+\)$")
INTERVAL_S = 0.001
TOP = 25
OURS = ("traces/", "connector/", "bench/", "backend/", "harness/", "opentelemetry/")
"""Files whose functions' inclusive time `compare` lists: kvscope's packages and OTel's SDK."""


class ArmProfiles:
    """One profiler per arm; each batch adds to its arm's session."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._profilers: dict = {}
        self._batches: Counter[str] = Counter()

    @contextlib.contextmanager
    def around(self, arm: str) -> Iterator[None]:
        from pyinstrument import Profiler

        profiler = self._profilers.get(arm)
        if profiler is None:
            profiler = self._profilers[arm] = Profiler(interval=self.interval_s)
        profiler.start()
        try:
            yield
        finally:
            profiler.stop()
            self._batches[arm] += 1

    def write(self, directory: Path, prefix: str) -> list[Path]:
        """Each arm's tree as text and its functions' own time as JSON; returns the paths."""
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for arm, profiler in self._profilers.items():
            session = profiler.last_session
            if session is None:
                continue
            text = directory / f"{prefix}-{arm}.txt"
            text.write_text(profiler.output_text(unicode=False, color=False, show_all=False))
            summary = {
                "arm": arm,
                "unit": "batch",
                "batches": self._batches[arm],
                "duration_s": session.duration,
                "functions": self_times(session.root_frame()),
                "inclusive": inclusive_times(session.root_frame()),
            }
            data = directory / f"{prefix}-{arm}.json"
            data.write_text(json.dumps(summary, indent=1))
            written += [text, data]
        return written


def self_times(root) -> dict[str, float]:
    """Seconds spent in each function itself (not its callees), summed over the tree; a
    function is named `function (file:line)`. pyinstrument keeps a frame's own time in a
    synthetic child ('[self]', '[await]'...): that time is the parent's."""
    totals: Counter[str] = Counter()
    stack = [(root, None)] if root is not None else []
    while stack:
        frame, parent = stack.pop()
        name = parent if frame.is_synthetic and parent else _name(frame)
        stack.extend((child, name) for child in frame.children)
        own = frame.time - sum(child.time for child in frame.children)
        if own > 0:
            totals[name] += own
    return dict(totals.most_common())


def inclusive_times(root) -> dict[str, float]:
    """Seconds spent in each function and its callees, summed over the tree (a recursive
    call counted once: only the outermost on each path). One pass: a function's count on the
    current path goes up as the walk enters a frame and down as it leaves."""
    totals: Counter[str] = Counter()
    on_path: Counter[str] = Counter()
    stack = [(root, True)] if root is not None else []
    while stack:
        frame, entering = stack.pop()
        if frame.is_synthetic:
            continue
        name = _name(frame)
        if not entering:
            on_path[name] -= 1
            continue
        if not on_path[name]:
            totals[name] += frame.time
        on_path[name] += 1
        stack.append((frame, False))
        stack.extend((child, True) for child in frame.children)
    return dict(totals.most_common())


def _name(frame) -> str:
    if frame.is_synthetic:
        return frame.function
    return f"{frame.function} ({frame.file_path_short}:{frame.line_no})"


class PySpy:
    """py-spy recording every thread of a process (this one, say) from start() to stop()."""

    def __init__(self, pid: int, raw: Path, rate_hz: int = 100) -> None:
        self.pid, self.raw, self.rate_hz = pid, raw, rate_hz
        self._process: subprocess.Popen | None = None
        self._started = 0.0

    def start(self, timeout_s: float = 10.0) -> None:
        """Starts py-spy and returns once it samples (it says so), so that what follows is
        recorded however briefly it runs; without py-spy the bench goes on unprofiled."""
        found = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
        command = [found, "record", "--pid", str(self.pid), "--rate", str(self.rate_hz)]
        command += ["--format", "raw", "--nonblocking", "-o", str(self.raw)]
        self.raw.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
            )
        except FileNotFoundError:
            self._process = None
            return
        sampling = threading.Event()
        threading.Thread(
            target=_read_until_exit, args=(self._process.stdout, sampling), daemon=True
        ).start()
        sampling.wait(timeout_s)
        self._started = time.perf_counter()

    def stop(self, arm: str) -> Path | None:
        """Ends the recording (py-spy writes it on SIGINT); its summary's path, or None if
        py-spy recorded nothing (not installed, or not allowed to read the process)."""
        if self._process is None:
            return None
        duration_s = time.perf_counter() - self._started
        self._process.send_signal(signal.SIGINT)
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=10)
        self._process = None
        if not self.raw.exists():
            return None
        return from_py_spy(self.raw, arm, duration_s, self.rate_hz)


def _read_until_exit(stream, sampling: threading.Event) -> None:
    """Drains py-spy's output; sets `sampling` at its 'Sampling process ...' line."""
    for line in stream:
        if "Sampling process" in line:
            sampling.set()
    sampling.set()  # exited: nothing to wait for


def from_py_spy(raw: Path, arm: str, duration_s: float, rate_hz: int) -> Path:
    """`py-spy record --format raw` output (one 'frame;frame;...;leaf count' line per stack)
    as the summary ArmProfiles writes, per second of the recording; returns the .json path."""
    functions: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples += int(count)
        leaf = stack.rsplit(";", 1)[-1]
        functions[_LINE.sub(")", leaf)] += int(count) / rate_hz  # py-spy names the line run
    summary = {
        "arm": arm,
        "unit": "s",
        "batches": duration_s,
        "duration_s": samples / rate_hz,
        "functions": dict(functions.most_common()),
    }
    path = raw.with_suffix(".json")
    path.write_text(json.dumps(summary, indent=1))
    return path


def compare(first: Path, second: Path, top: int = TOP) -> str:
    """Markdown tables: per batch, each arm's own time by package, then in the functions
    whose own time differs most between the arms."""
    ours, theirs = (json.loads(path.read_text()) for path in (first, second))
    per_batch = [
        {name: seconds / arm["batches"] for name, seconds in arm["functions"].items()}
        for arm in (ours, theirs)
    ]
    a, b = ours["arm"], theirs["arm"]
    unit = ours.get("unit", "batch")
    total = [arm["duration_s"] / arm["batches"] * 1e3 for arm in (ours, theirs)]
    lines = [
        f"per {unit}: {a} {total[0]:.1f} ms, {b} {total[1]:.1f} ms "
        f"(over {ours['batches']:g} and {theirs['batches']:g})",
        "",
        *_table("package (own time)", a, b, [_by_package(arm) for arm in per_batch], top, unit),
        "",
        *_table("function (own time)", a, b, per_batch, top, unit),
    ]
    inclusive = [
        {
            name: seconds / arm["batches"]
            for name, seconds in arm.get("inclusive", {}).items()
            if name.rpartition(" (")[2].removeprefix("kvscope/").startswith(OURS)
        }
        for arm in (ours, theirs)
    ]
    if inclusive[0] or inclusive[1]:
        lines += [
            "",
            *_table("kvscope or OTel function (with callees)", a, b, inclusive, top, unit),
        ]
    return "\n".join(lines)


def _by_package(functions: dict[str, float]) -> dict[str, float]:
    """Own time summed by the first folder of each function's file (vllm, torch, traces...)."""
    packages: Counter[str] = Counter()
    for name, seconds in functions.items():
        _, found, where = name.rpartition(" (")
        path = where.rstrip(")").split(":")[0] if found else name  # "[self]" has no file
        packages[path.split("/")[0]] += seconds
    return dict(packages)


def _table(
    kind: str, a: str, b: str, arms: list[dict[str, float]], top: int, unit: str
) -> list[str]:
    names = sorted(
        set(arms[0]) | set(arms[1]),
        key=lambda n: arms[0].get(n, 0) - arms[1].get(n, 0),
        reverse=True,
    )
    lines = [f"| {kind} | {a} ms/{unit} | {b} ms/{unit} | difference |"]
    lines.append("| --- | --- | --- | --- |")
    for name in names[:top]:
        x, y = (arm.get(name, 0) * 1e3 for arm in arms)
        lines.append(f"| `{name}` | {x:.2f} | {y:.2f} | {x - y:+.2f} |")
    return lines
