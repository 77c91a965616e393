"""A report run saved beside its results (machine, bench runs), so the report can be rewritten."""

import json
from dataclasses import asdict
from pathlib import Path

from kvscope.bench.report.machine import Machine
from kvscope.bench.report.runner import BenchRun

RUN_FILE = "run.json"


def save_run(out_dir: Path, machine: Machine, runs: list[BenchRun], command: str) -> None:
    runs_saved = [asdict(run) | {"log_path": str(run.log_path or "")} for run in runs]
    saved = {"version": 1, "command": command, "machine": asdict(machine), "runs": runs_saved}
    (out_dir / RUN_FILE).write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")


def load_run(out_dir: Path) -> tuple[Machine, list[BenchRun], str]:
    """What save_run wrote; log paths are taken as relative to out_dir's logs folder."""
    saved = json.loads((out_dir / RUN_FILE).read_text(encoding="utf-8"))
    machine = Machine(**saved["machine"])
    machine.loads = [tuple(sample) for sample in machine.loads]
    runs = []
    for fields in saved["runs"]:
        log_name = Path(fields.pop("log_path")).name
        runs.append(BenchRun(**fields, log_path=out_dir / "logs" / log_name if log_name else None))
    return machine, runs, saved["command"]
