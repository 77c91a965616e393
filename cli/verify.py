"""`kvscope verify`: parses its options, runs the scenarios, prints the report, sets the status."""

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path


def add_parser(commands) -> None:
    verify = commands.add_parser(
        "verify", help="check a KV connector against vLLM's connector contract on real engines"
    )
    verify.add_argument(
        "--connector",
        required=True,
        metavar="NAME_OR_MODULE:CLASS",
        help="a vLLM built-in (ExampleConnector), a kvscope connector "
        "(CpuOffloadConnector), or package.module:ClassName",
    )
    verify.add_argument(
        "--config",
        default="{}",
        metavar="JSON",
        help="the connector's kv_connector_extra_config, as JSON",
    )
    verify.add_argument("--model", help="model folder (default: the tiny model, built if missing)")
    verify.add_argument(
        "--tp", type=int, default=1, help="tensor_parallel_size (CPU: one core per rank)"
    )
    verify.add_argument(
        "--scenario",
        action="append",
        metavar="NAME",
        help="run only this scenario (repeatable; default: all)",
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.set_defaults(handler=run_verify)


def run_verify(args: argparse.Namespace) -> int:
    """0 when every check passed, 1 when one failed, 2 for bad input. Only the report goes to
    stdout (vLLM's log goes to stderr with the progress lines), so --json output parses."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from kvscope.harness.engine import use_in_process_engine
    from kvscope.model.shapes import default_model_dir
    from kvscope.verify.connectors import parse_connector
    from kvscope.verify.report import as_json, as_table
    from kvscope.verify.runner import select, verify

    # Checked cheapest first: only a connector name that may be a vLLM built-in imports vLLM
    # (seconds), so a typo anywhere else is answered at once.
    model = Path(args.model) if args.model else default_model_dir()
    try:
        extra = json.loads(args.config)
        if not isinstance(extra, dict):
            raise ValueError(f"--config must be a JSON object, got {type(extra).__name__}")
        select(args.scenario)
        if args.tp < 1:
            raise ValueError(f"--tp must be at least 1, got {args.tp}")
        if args.model and not (model / "config.json").is_file():
            raise ValueError(f"no model at {model} (config.json missing)")
        spec = parse_connector(args.connector, extra)
    except ValueError as exc:  # json.JSONDecodeError too
        print(f"kvscope verify: {exc}", file=sys.stderr)
        return 2
    if not (model / "config.json").is_file():
        from kvscope.model.build import build_model  # torch: only to build one

        build_model(model)
    use_in_process_engine()
    with _stdout_to_stderr():
        report = verify(spec, model, args.tp, args.scenario)
    print(as_json(report) if args.json else as_table(report))
    return 0 if report.passed else 1


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 onto 2 for a while: libraries that print to stdout from native code
    (NIXL, UCX) or through handlers bound to it cannot mix into the report."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
