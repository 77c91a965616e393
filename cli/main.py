"""The `kvscope` command: parses arguments and hands each subcommand to its module."""

import argparse
import sys
from pathlib import Path
from typing import NoReturn


def _model_build(args: argparse.Namespace) -> int:
    from kvscope.model.build import build_model, default_model_dir

    out = Path(args.out) if args.out else default_model_dir(args.shape, args.seed)
    print(f"building {args.shape} model (seed {args.seed}) in {out} ...", flush=True)
    build_model(out, shape=args.shape, seed=args.seed)
    print(f"done: {out}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    if args.pair:
        from kvscope.cli.doctor_pair import run_pair

        return run_pair(
            *args.pair,
            prefill_side_channel=args.prefill_side_channel,
            decode_side_channel=args.decode_side_channel,
            timeout_s=args.timeout,
        )
    from kvscope.cli.doctor import run_doctor

    return run_doctor(Path(args.model) if args.model else None)


def _quickstart(args: argparse.Namespace) -> int:
    from kvscope.demo.quickstart import run_quickstart

    return run_quickstart(Path(args.model) if args.model else None, args.prompts)


def _demo(args: argparse.Namespace) -> int:
    from kvscope.demo.run import DemoOptions, run_demo
    from kvscope.model.build import build_model, default_model_dir

    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("--gpu: no CUDA device here; run without --gpu to use the CPU", file=sys.stderr)
            return 2
    model = Path(args.model) if args.model else default_model_dir()
    if not (model / "config.json").is_file():
        build_model(model)
    options = DemoOptions(
        model=model,
        duration_s=args.duration,
        rate_per_s=args.rate,
        concurrency=args.concurrency,
        faults=not args.no_faults,
        dashboard=not args.no_dashboard,
        otlp_endpoint=args.otlp_endpoint,
        workdir=Path(args.workdir) if args.workdir else None,
        backend_port=args.backend_port,
        dashboard_port=args.dashboard_port,
        proxy_port=args.proxy_port,
    )
    return run_demo(options)


def _backend(args: argparse.Namespace) -> int:
    import os

    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    from kvscope.backend.server import run

    run(host=args.host, port=args.port, grpc_port=args.grpc_port)
    return 0


def _dashboard(args: argparse.Namespace) -> NoReturn:
    from kvscope.dashboard.launch import run

    run(host=args.host, port=args.port, backend_url=args.backend)  # becomes streamlit


def _proxy(args: argparse.Namespace) -> int:
    from kvscope.harness.proxy import run

    run(args.host, args.port, args.prefill_url, args.decode_url)
    return 0


def _replay(args: argparse.Namespace) -> int:
    from kvscope.demo.replay import RECORDINGS, replay

    path = Path(args.recording) if args.recording else RECORDINGS / "demo.jsonl.gz"
    if not path.is_file():
        print(f"no recording at {path}: record one with KVSCOPE_TRACES_FILE=...", file=sys.stderr)
        return 2
    sent = replay(path, args.backend, args.token, args.speed, now=not args.keep_times)
    print(f"replayed {sent} batches from {path} into {args.backend}")
    return 0


def _grafana_dashboard(args: argparse.Namespace) -> int:
    from kvscope.deploy import GRAFANA_DASHBOARD, read

    sys.stdout.write(read(GRAFANA_DASHBOARD))
    return 0


def _deploy_files(args: argparse.Namespace) -> int:
    from kvscope.deploy import write_all

    for path in write_all(Path(args.out)):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from kvscope.model.shapes import SHAPES

    parser = argparse.ArgumentParser(prog="kvscope", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    model = commands.add_parser("model", help="build the tiny local model")
    model_commands = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    build = model_commands.add_parser("build", help="write a tiny Llama with random weights")
    build.add_argument("--out", help="output folder (default: ~/.cache/kvscope/models/SHAPE-seedN)")
    build.add_argument("--seed", type=int, default=0, help="weights and tokenizer seed")
    build.add_argument("--shape", choices=sorted(SHAPES), default="tiny", help="model shape")
    build.set_defaults(handler=_model_build)

    doctor = commands.add_parser("doctor", help="check vLLM, torch, NIXL, OTel and the model")
    doctor.add_argument("--model", help="model folder to check (default: the tiny model)")
    doctor.add_argument(
        "--pair",
        nargs=2,
        metavar=("PREFILL_URL", "DECODE_URL"),
        help="instead: check that two running vllm servers agree on the KV they trade",
    )
    doctor.add_argument("--prefill-side-channel", help="HOST:PORT of its P2P side channel")
    doctor.add_argument("--decode-side-channel", help="HOST:PORT of its P2P side channel")
    doctor.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="seconds per request (--pair: /server_info gets at least 60, see cli/pair_probe.py)",
    )
    doctor.set_defaults(handler=_doctor)

    demo = commands.add_parser("demo", help="run the whole system here (Ctrl-C stops it)")
    demo.add_argument("--model", help="model folder (default: the tiny model, built if missing)")
    demo.add_argument("--duration", type=float, default=0, help="seconds; 0 runs until Ctrl-C")
    demo.add_argument("--rate", type=float, default=2.0, help="requests per second")
    demo.add_argument("--concurrency", type=int, default=4, help="requests in flight at most")
    demo.add_argument("--no-faults", action="store_true", help="inject no faults")
    demo.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    demo.add_argument("--gpu", action="store_true", help="require a CUDA GPU (vllm CUDA build)")
    demo.add_argument("--otlp-endpoint", help="extra span destination, e.g. grpc://jaeger:4317")
    demo.add_argument("--workdir", help="logs and database (default: a new temporary folder)")
    demo.add_argument("--backend-port", type=int, default=4318)
    demo.add_argument("--dashboard-port", type=int, default=8501)
    demo.add_argument("--proxy-port", type=int, default=8000)
    demo.set_defaults(handler=_demo)

    quick = commands.add_parser("quickstart", help="one engine, TracedConnector, two passes")
    quick.add_argument("--model", help="model folder (default: the tiny model)")
    quick.add_argument("--prompts", type=int, default=4, help="number of prompts")
    quick.set_defaults(handler=_quickstart)
    backend = commands.add_parser("backend", help="serve the OTLP backend (REST, WebSocket)")
    backend.add_argument("--host", help="bind address (default KVSCOPE_BACKEND_HOST, 127.0.0.1)")
    backend.add_argument("--port", type=int, help="port (default KVSCOPE_BACKEND_PORT, 4318)")
    backend.add_argument(
        "--grpc-port",
        type=int,
        help="OTLP/gRPC port on the same host (default KVSCOPE_BACKEND_GRPC_PORT, 4317; 0: none)",
    )
    backend.add_argument("--database-url", help="SQLAlchemy URL (default DATABASE_URL, SQLite)")
    backend.set_defaults(handler=_backend)

    dashboard = commands.add_parser("dashboard", help="serve the live Streamlit dashboard")
    dashboard.add_argument("--host", default="127.0.0.1", help="bind address")
    dashboard.add_argument("--port", type=int, default=8501, help="port")
    dashboard.add_argument("--backend", help="backend URL (default KVSCOPE_BACKEND_URL)")
    dashboard.set_defaults(handler=_dashboard)

    proxy = commands.add_parser("proxy", help="serve the P/D proxy (prefill, then decode)")
    proxy.add_argument("--host", default="127.0.0.1", help="bind address")
    proxy.add_argument("--port", type=int, default=8000, help="port")
    proxy.add_argument("--prefill-url", required=True, help="prefill server base URL")
    proxy.add_argument("--decode-url", required=True, help="decode server base URL")
    proxy.set_defaults(handler=_proxy)

    replay = commands.add_parser("replay", help="feed recorded spans into a running backend")
    replay.add_argument("recording", nargs="?", help="OTLP/JSON lines (default: the demo's)")
    replay.add_argument("--backend", default="http://127.0.0.1:4318", help="backend URL")
    replay.add_argument("--token", help="bearer token, if the backend wants one")
    replay.add_argument("--speed", type=float, default=0.0, help="batches per second (0: fast)")
    replay.add_argument("--keep-times", action="store_true", help="do not move times to now")
    replay.set_defaults(handler=_replay)

    grafana = commands.add_parser(
        "grafana-dashboard", help="print the Grafana dashboard JSON (import it, or provision it)"
    )
    grafana.set_defaults(handler=_grafana_dashboard)
    deploy = commands.add_parser(
        "deploy-files", help="write the Grafana, Prometheus and OpenTelemetry Collector files"
    )
    deploy.add_argument(
        "out", help="folder to write grafana/, prometheus/ and otel-collector/ into"
    )
    deploy.set_defaults(handler=_deploy_files)

    from kvscope.cli.plan import add_parser as add_plan
    from kvscope.cli.verify import add_parser as add_verify

    add_verify(commands)
    add_plan(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
