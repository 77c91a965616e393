"""The benches the report runs: module, quick and full arguments, and a timeout for each."""

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class BenchSpec:
    """One bench as a subprocess: `command` is the argv before any size arguments."""

    name: str
    command: list[str]
    quick_args: list[str] = field(default_factory=list)
    full_args: list[str] = field(default_factory=list)
    quick_timeout_s: float = 600
    full_timeout_s: float = 1800

    def argv(self, quick: bool) -> list[str]:
        return [*self.command, *(self.quick_args if quick else self.full_args)]

    def timeout_s(self, quick: bool) -> float:
        return self.quick_timeout_s if quick else self.full_timeout_s


SUBJECTS = {
    "tracing_overhead": "engine",
    "offload_ttft": "engine",
    "convoy_bursts": "engine",
    "copy_bandwidth": "transfer",
    "nixl_bandwidth": "transfer",
    "pd_latency": "pd",
    "ingest": "backend",
    "scale": "backend",
    "scale_out": "backend",
    "telemetry_isolation": "engine",
}
"""The subject folder of each module bench (bench/<subject>/<name>.py); the soak is a subject
of its own (bench/soak/)."""


def module_bench(name: str, **sizes) -> BenchSpec:
    """A bench run as `python -m kvscope.bench.<subject>.<name>`."""
    module = (
        f"kvscope.bench.{SUBJECTS[name]}.{name}" if name in SUBJECTS else f"kvscope.bench.{name}"
    )
    return BenchSpec(name, [sys.executable, "-m", module], **sizes)


BENCHES: list[BenchSpec] = [
    module_bench(
        "tracing_overhead", quick_args=["--rounds", "40"], quick_timeout_s=600, full_timeout_s=2400
    ),
    module_bench(
        "copy_bandwidth", quick_args=["--repeats", "31"], quick_timeout_s=300, full_timeout_s=900
    ),
    module_bench(
        "nixl_bandwidth",
        quick_args=[
            "--blocks",
            "128",
            "--read-blocks",
            "48",
            "--rounds",
            "2",
            "--trials",
            "2",
            "--idle-s",
            "1",
        ],
        quick_timeout_s=300,
        full_timeout_s=900,
    ),
    # The mid model (model/shapes.py): quick at the 2k-token headline length only.
    module_bench(
        "offload_ttft",
        quick_args=["--shape", "mid", "--prefix-tokens", "2048", "--repeats", "3", "--rounds", "1"],
        full_args=[
            "--shape",
            "mid",
            "--prefix-tokens",
            "1024,2048,4096",
            "--repeats",
            "5",
            "--rounds",
            "2",
        ],
        quick_timeout_s=400,
        full_timeout_s=1200,
    ),
    # The mid model at a 2k-token prefix: a tiny model's prefill is too cheap to show a convoy.
    module_bench(
        "convoy_bursts",
        quick_args=["--shape", "mid", "--repeats", "1", "--rounds", "1"],
        full_args=["--shape", "mid", "--repeats", "3", "--rounds", "2"],
        quick_timeout_s=600,
        full_timeout_s=1500,
    ),
    # Quick: the tiny model's short prompts (the connector's own overheads against the stock
    # pair); full: the mid model at three prompt lengths, every request prefilled for real.
    module_bench(
        "pd_latency",
        quick_args=["--requests", "10", "--idle-s", "2", "--start-timeout", "240"],
        full_args=[
            "--shape",
            "mid",
            "--prefix-tokens",
            "1024,2048,4096",
            "--requests",
            "8",
            "--warmup",
            "1",
        ],
        quick_timeout_s=900,
        full_timeout_s=3600,
    ),
    module_bench(
        "ingest",
        quick_args=["--spans", "10000", "--samples", "50", "--compare-spans", "20000"],
        full_args=["--spans", "1000000"],
        quick_timeout_s=300,
        full_timeout_s=3600,
    ),
    # PostgreSQL from KVSCOPE_BENCH_POSTGRES_URL, or a throwaway one from scripts/postgres.sh:
    # scale fills it after SQLite (10M spans there took 35 minutes here).
    module_bench(
        "scale",
        quick_args=["--spans", "200000", "--samples", "30", "--with-postgres"],
        full_args=["--spans", "10000000", "--with-postgres"],
        quick_timeout_s=600,
        full_timeout_s=4 * 3600,
    ),
    module_bench(
        "scale_out",
        quick_args=["--spans", "40000"],
        full_args=["--spans", "200000"],
        quick_timeout_s=300,
        full_timeout_s=900,
    ),
    module_bench(
        "telemetry_isolation",
        quick_args=["--rounds", "16"],
        quick_timeout_s=600,
        full_timeout_s=2400,
    ),
    module_bench(
        "soak", quick_args=["--requests", "150"], quick_timeout_s=600, full_timeout_s=6 * 3600
    ),
]
"""In run order; --quick sizes keep the whole quick report to about 10-15 minutes."""


def module_sources(module: str) -> list[Path]:
    """Source files of a module or package, without importing it; [] when it is absent."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or spec.origin in (None, "namespace"):
        return []
    origin = Path(spec.origin)
    return sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]


def supported_args(spec: BenchSpec, args: list[str]) -> tuple[list[str], list[str]]:
    """(args whose flags the bench's source defines, flags it does not define).

    Benches change their options while this list stays put; a flag the bench lacks is dropped
    (and reported) rather than failing the bench on argparse. Only `-m kvscope...` benches
    are checked; a value follows each flag.
    """
    if len(spec.command) < 3 or spec.command[1] != "-m":
        return args, []
    sources = module_sources(spec.command[2])
    if not sources:
        return args, []
    text = "\n".join(path.read_text(encoding="utf-8", errors="replace") for path in sources)
    kept: list[str] = []
    dropped: list[str] = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if f'"{flag}"' in text or f"'{flag}'" in text:
            kept += [flag, value]
        else:
            dropped.append(flag)
    return kept, dropped


def bench_missing(spec: BenchSpec) -> str:
    """Why a bench cannot run here (its module does not exist), or ""."""
    if len(spec.command) >= 3 and spec.command[1] == "-m":
        module = spec.command[2]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            return f"module {module} does not exist (yet)"
    return ""
