"""Reference tokens: each unique prompt's greedy tokens from one in-process vLLM engine with no
connector, written as a JSON table; the soak runs it as a subprocess.

    python -m kvscope.bench.soak.reference MODEL PROMPTS_JSON OUT_JSON [--max-tokens N]
        [--max-num-seqs N]

The engine decodes at most as many requests at a time as the soak's clients send at once:
vLLM's CPU kernels are not batch-invariant (on a Xeon with AMX, one of the 48-request soak's
prompts gave other tokens from token 23 on when decoded 16 at a time than 4, 2 or 1 at a time).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

from kvscope.harness.engine import engine_env


def reference_command(
    model: Path, prompts_path: Path, out_path: Path, max_tokens: int, max_num_seqs: int
) -> list:
    return [
        sys.executable,
        "-m",
        "kvscope.bench.soak.reference",
        str(model),
        str(prompts_path),
        str(out_path),
        "--max-tokens",
        str(max_tokens),
        "--max-num-seqs",
        str(max_num_seqs),
    ]


def start_reference(
    model: Path, prompts: list[str], workdir: Path, max_tokens: int, max_num_seqs: int
):
    """Starts the reference run in the background, decoding at most max_num_seqs requests at
    a time; returns (process, path of its table)."""
    prompts_path, out_path = workdir / "reference_prompts.json", workdir / "reference.json"
    prompts_path.write_text(json.dumps(prompts))
    log = open(workdir / "reference.log", "wb")  # noqa: SIM115 (the child owns it)
    process = subprocess.Popen(
        reference_command(model, prompts_path, out_path, max_tokens, max_num_seqs),
        env=engine_env(VLLM_ENABLE_V1_MULTIPROCESSING="0", KVSCOPE_TRACING="off"),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    log.close()
    return process, out_path


def wait_reference(process: subprocess.Popen, out_path: Path, timeout_s: float) -> dict:
    """prompt -> reference token ids; raises with the log's place when the run failed."""
    try:
        code = process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
        raise TimeoutError(f"reference run over {timeout_s:.0f} s; see {out_path.parent}") from None
    if code != 0:
        raise RuntimeError(f"reference run failed ({code}); see {out_path.parent}/reference.log")
    return json.loads(out_path.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("prompts", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=4, help="requests decoded at once")
    args = parser.parse_args(argv)

    from kvscope.harness.engine import in_process_llm
    from kvscope.harness.oracle import greedy_tokens

    prompts = json.loads(args.prompts.read_text())
    with in_process_llm(args.model, max_num_seqs=args.max_num_seqs) as llm:
        tokens = greedy_tokens(llm, prompts, args.max_tokens)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(zip(prompts, tokens, strict=True))))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
