"""python -m kvscope.bench.soak: the P/D + offload system under many requests; exits 1 when a
check fails."""

import argparse
import json
import signal
import sys
from pathlib import Path

from kvscope.bench.soak.run import SoakOptions, run_soak


def default_model() -> Path:
    return Path.home() / ".cache" / "kvscope" / "models" / "tiny-seed0"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kvscope.bench.soak", description=__doc__)
    parser.add_argument("--model", type=Path, default=default_model())
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="prompts, lengths, aborts")
    parser.add_argument(
        "--abort-fraction",
        type=float,
        default=0.1,
        help="requests the client disconnects from after a random number of tokens",
    )
    parser.add_argument("--no-faults", action="store_true", help="no fault schedule")
    parser.add_argument(
        "--policy",
        choices=("recompute", "fail"),
        default="recompute",
        help="vLLM's kv_load_failure_policy on both servers",
    )
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds each")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=60.0,
        help="seconds to wait, after the last request, for nothing to be held",
    )
    parser.add_argument(
        "--max-rss-growth",
        type=float,
        default=256.0,
        help="MiB a process may grow over the second half of the run",
    )
    parser.add_argument("--workdir", type=Path, help="logs, database, state files")
    parser.add_argument(
        "--default-executor",
        action="store_true",
        help="servers run with vLLM's default executor (the model in a worker process), not"
        " with VLLM_ENABLE_V1_MULTIPROCESSING=0",
    )
    parser.add_argument(
        "--tier-health",
        type=json.loads,
        help="the offload pool's breaker settings as JSON, e.g. '{\"failures_to_bypass\": 0}'"
        " (off) to see the sick-tier phase without it; default: the connector's own",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.model.exists():
        print(f"no model at {args.model}: build it with `kvscope model build`", file=sys.stderr)
        return 2
    options = SoakOptions(
        model=args.model,
        requests=args.requests,
        concurrency=args.concurrency,
        seed=args.seed,
        abort_fraction=args.abort_fraction,
        faults=not args.no_faults,
        policy=args.policy,
        request_timeout_s=args.request_timeout,
        idle_timeout_s=args.idle_timeout,
        max_rss_growth_mib=args.max_rss_growth,
        workdir=args.workdir,
        default_executor=args.default_executor,
        tier_health=args.tier_health,
    )
    # SIGTERM unwinds like Ctrl-C, so every server the soak started is stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        results = run_soak(options)
    except KeyboardInterrupt:
        print("soak interrupted; every process it started was stopped", file=sys.stderr)
        return 130
    failed = [result.name for result in results if not result.ok]
    print("\nsoak " + ("passed" if not failed else "FAILED: " + ", ".join(failed)), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
