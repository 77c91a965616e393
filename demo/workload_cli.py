"""python -m kvscope.demo.workload_cli: the demo's workload and fault schedule, standalone."""

import argparse
import asyncio
import sys
import time
from pathlib import Path

from kvscope.demo.fault_schedule import FaultSchedule
from kvscope.demo.workload import WorkloadStats, run_workload

SLICE_S = 5.0
"""Progress is printed, and the fault schedule moved along, this often."""

FAULT_CYCLE_S = 120.0
"""With no duration the fault schedule repeats over this many seconds."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kvscope.demo.workload_cli", description=__doc__
    )
    parser.add_argument("--target", required=True, help="P/D proxy (or any vLLM server) base URL")
    parser.add_argument(
        "--decode-url", help="also send every 4th request straight to this server, as the demo does"
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds; 0 runs forever")
    parser.add_argument("--rate", type=float, default=2.0, help="requests per second")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at most")
    parser.add_argument(
        "--faults-file", help="fault plan file the offload connectors re-read (default: no faults)"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    targets = [args.target.rstrip("/")] * 3
    if args.decode_url:
        targets.append(args.decode_url.rstrip("/"))
    faults = FaultSchedule(Path(args.faults_file), enabled=True) if args.faults_file else None
    stats = WorkloadStats()
    started = time.monotonic()
    while args.duration == 0 or time.monotonic() - started < args.duration:
        elapsed = time.monotonic() - started
        if faults is not None:
            fraction = (
                elapsed / args.duration
                if args.duration
                else elapsed % FAULT_CYCLE_S / FAULT_CYCLE_S
            )
            if name := faults.update(fraction):
                print(f"[{elapsed:5.0f} s] faults: {name}", flush=True)
        slice_s = min(SLICE_S, args.duration - elapsed) if args.duration else SLICE_S
        asyncio.run(run_workload(targets, slice_s, args.rate, args.concurrency, stats, stats.sent))
        print(f"[{time.monotonic() - started:5.0f} s] {stats.line()}", flush=True)
    return 0 if stats.ok > 0 else 1


def main(argv: list[str] | None = None) -> int:
    try:
        return run(build_parser().parse_args(argv))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
