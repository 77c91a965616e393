"""Time to first token with a long shared prefix served from the CPU offload pool, over
recomputing it with no connector, measured side by side in one run, at one or more prefix
lengths.

    python -m kvscope.bench.engine.offload_ttft [--shape mid] [--prefix-tokens 1024,2048,4096]
        [--repeats 5] [--rounds 2]

Each round starts one engine per arm (recompute, offload) and times every length on it: a
warm-up request first (it stores the prefix, and runs the kernels at that length once), then
--repeats requests behind the same prefix with vLLM's prefix cache reset before each.
"""

import argparse
import os
import statistics
import time
from pathlib import Path

from kvscope.bench.common.results import length_metric, record
from kvscope.harness import configs

TARGET = "<= 0.1"
"""The goal at the headline length (2k tokens on the mid model)."""
ROOM_TOKENS = 512
"""max_model_len above the longest prefix: the question and the output."""


def offload_config(pool_bytes: int = 256 << 20) -> dict:
    """The offload connector alone, with a pool large enough for every prefix length."""
    return configs.offload_config(cpu_bytes_to_use=pool_bytes)


def ttft_s(llm, prompt_ids: list[int]) -> float:
    """Wall time of a one-token generation: the prefill (and any KV load) plus one step."""
    from kvscope.harness.oracle import greedy_params

    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt_ids}], greedy_params(1), use_tqdm=False)
    return time.perf_counter() - start


def measure(
    model: Path, config: dict | None, lengths: list[int], repeats: int
) -> dict[int, list[float]]:
    """TTFTs per prefix length of prompts sharing that prefix; one engine for all lengths."""
    from kvscope.harness.engine import in_process_llm
    from kvscope.model.prompts import encode, token_prompt

    times: dict[int, list[float]] = {}
    with in_process_llm(model, config, max_model_len=max(lengths) + ROOM_TOKENS) as llm:
        for tokens in lengths:
            prefix = token_prompt(model, tokens, seed=tokens)
            ttft_s(llm, prefix + encode(model, " Warm-up question."))  # stores the prefix
            for _ in range(20):  # let the stores commit
                llm.llm_engine.step()
            times[tokens] = []
            for i in range(repeats):
                llm.reset_prefix_cache()
                times[tokens].append(ttft_s(llm, prefix + encode(model, f" Question {i}?")))
    return times


def parse_lengths(text: str) -> list[int]:
    lengths = [int(part) for part in text.split(",") if part.strip()]
    if not lengths or min(lengths) < 32:
        raise argparse.ArgumentTypeError(f"prefix lengths of at least 32 tokens, not {text!r}")
    return lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", help="model shape (model/shapes.py)")
    parser.add_argument("--model", type=Path, default=None, help="model dir (over --shape)")
    parser.add_argument(
        "--prefix-tokens",
        type=parse_lengths,
        default=[1024],
        help="shared prefix lengths in tokens, comma-separated",
    )
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)

    from kvscope.harness.engine import use_in_process_engine
    from kvscope.model.build import ensure_model
    from kvscope.model.shapes import SHAPES

    use_in_process_engine()
    model = args.model or ensure_model(args.shape)
    lengths = args.prefix_tokens
    pool = max(256 << 20, 3 * sum(lengths) * SHAPES[args.shape].kv_bytes_per_token)
    results = {arm: {n: [] for n in lengths} for arm in ("recompute", "offload")}
    for round_index in range(args.rounds):
        for arm, config in (("recompute", None), ("offload", offload_config(pool))):
            for tokens, times in measure(model, config, lengths, args.repeats).items():
                results[arm][tokens] += times
                print(
                    f"round {round_index + 1}: {arm:9s} {tokens:5d} tokens: median TTFT "
                    f"{statistics.median(times) * 1000:8.1f} ms",
                    flush=True,
                )
    report(results, args.shape, len(lengths))
    return 0


def report(results: dict[str, dict[int, list[float]]], shape: str, count: int) -> None:
    """The table, and per length: the ratio and both medians as figures."""
    print("\n| prefix tokens | recompute TTFT (ms) | offload hit TTFT (ms) | hit over recompute |")
    print("| --- | --- | --- | --- |")
    for tokens, recompute_s in results["recompute"].items():
        recompute = statistics.median(recompute_s)
        offload = statistics.median(results["offload"][tokens])
        ratio = offload / recompute
        print(f"| {tokens} | {recompute * 1000:.1f} | {offload * 1000:.1f} | {ratio:.3f} |")
        metric = length_metric("ttft_hit_over_recompute", shape, tokens, count)
        headline = metric.endswith("_mid") or metric == "ttft_hit_over_recompute"
        note = (
            f"{offload * 1000:.1f} vs {recompute * 1000:.1f} ms, {shape} model, {tokens}-token"
            f" prefix, median of {len(results['offload'][tokens])}; 1-min load at the end"
            f" {os.getloadavg()[0]:.1f}"
        )
        record("offload_ttft", metric, ratio, "ratio", TARGET if headline else "", note)
        record("offload_ttft", f"ttft_recompute_{shape}_{tokens}_ms", recompute * 1000, "ms")
        record("offload_ttft", f"ttft_hit_{shape}_{tokens}_ms", offload * 1000, "ms")


if __name__ == "__main__":
    raise SystemExit(main())
