"""The `kvscope` command: parses arguments and hands each subcommand to its module."""

import argparse
import sys
from pathlib import Path


def _model_build(args: argparse.Namespace) -> int:
    from kvscope.model.build import build_model, default_model_dir

    out = Path(args.out) if args.out else default_model_dir(args.shape, args.seed)
    print(f"building {args.shape} model (seed {args.seed}) in {out} ...", flush=True)
    build_model(out, shape=args.shape, seed=args.seed)
    print(f"done: {out}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from kvscope.cli.doctor import run_doctor

    return run_doctor(Path(args.model) if args.model else None)


def _demo(args: argparse.Namespace) -> int:
    from kvscope.demo.quickstart import run_quickstart

    return run_quickstart(Path(args.model) if args.model else None, args.prompts)


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
    doctor.set_defaults(handler=_doctor)

    demo = commands.add_parser(
        "demo", help="run the tiny model through vLLM with a kvscope connector"
    )
    demo.add_argument("--model", help="model folder (default: the tiny model)")
    demo.add_argument("--prompts", type=int, default=4, help="number of prompts")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
