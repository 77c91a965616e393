"""Bursts of concurrent requests sharing one prefix held in the host pool, against recompute:
throughput and TTFT p50/p99 at each burst size, as ratios measured side by side in one run.

    python -m kvscope.bench.engine.convoy_bursts [--shape mid] [--prefix-tokens 2048]
        [--bursts 1,4,16] [--repeats 3] [--rounds 2] [--max-tokens 8]

Each round starts one engine per arm, in turn (recompute: no connector; offload: the CPU
offload connector; offload_load_each: the same with share_loads off), and runs every burst size
on it, --repeats bursts each, vLLM's prefix cache reset before every burst so the offload arms'
prefix comes from the host pool (a warm-up request stores it first) and the recompute arm
computes it. A burst's requests arrive together: on the offload arm one load serves them all
(connector/cpu_offload/shared_loads.py); on the load-each arm every request loads the prefix
itself, N loads of the same host blocks queued on the copy thread (convoys.py), the convoy
vllm#44294 reports. The offload arm's greedy tokens must equal those of the same bursts with
the prefix in vLLM's own prefix cache (run on the recompute arm's engine after its timed ones).
"""

import argparse
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvscope.bench.engine.convoy_report import LOAD_EACH, report

ROOM_TOKENS = 256
"""max_model_len above the prefix: the question and the output."""


@dataclass
class BurstTimes:
    """Every burst of one size on one arm: each request's TTFT, each burst's wall time."""

    ttfts_s: list[float] = field(default_factory=list)
    walls_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    tokens: dict[str, list[int]] = field(default_factory=dict)  # prompt key -> greedy tokens

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / sum(self.walls_s)


def reset_prefix_cache(llm, timeout_s: float = 60.0) -> None:
    """vLLM refuses while a connector still holds finished requests' blocks: step until not."""
    deadline = time.monotonic() + timeout_s
    while not llm.reset_prefix_cache():
        if time.monotonic() > deadline:
            raise RuntimeError("vLLM's prefix cache reset was refused for a minute")
        llm.llm_engine.step()
        time.sleep(0.005)


def run_burst(llm, prompts: dict[str, list[int]], max_tokens: int, times: BurstTimes) -> None:
    """Adds every prompt at once and steps the engine until all finished."""
    from kvscope.harness.oracle import greedy_params

    engine, params = llm.llm_engine, greedy_params(max_tokens)
    start = time.perf_counter()
    for key, prompt_ids in prompts.items():
        engine.add_request(key, {"prompt_token_ids": prompt_ids}, params)
    first: dict[str, float] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.outputs[0].token_ids and output.request_id not in first:
                first[output.request_id] = time.perf_counter() - start
            if output.finished:
                times.tokens[output.request_id] = list(output.outputs[0].token_ids)
    times.walls_s.append(time.perf_counter() - start)
    times.ttfts_s += first.values()
    times.output_tokens += len(prompts) * max_tokens


def measure(
    model: Path, config: dict | None, prefix_tokens: int, bursts: list[int], args
) -> tuple[dict[int, BurstTimes], dict[str, list[int]]]:
    """Every burst size on one engine, and each prompt's greedy tokens with its prefix in vLLM's
    own prefix cache (the oracle's reference: a hit either way computes only the question)."""
    from kvscope.harness.engine import in_process_llm
    from kvscope.harness.oracle import greedy_params
    from kvscope.model.prompts import encode, token_prompt

    prefix = token_prompt(model, prefix_tokens, seed=prefix_tokens)
    results = {n: BurstTimes() for n in bursts}
    local_hits = BurstTimes()
    max_len = prefix_tokens + ROOM_TOKENS
    with in_process_llm(model, config, max_model_len=max_len, max_num_seqs=max(bursts)) as llm:
        warm_up = [{"prompt_token_ids": prefix + encode(model, " Warm-up question.")}]
        llm.generate(warm_up, greedy_params(1), use_tqdm=False)  # stores the prefix
        burst = {f"warm-up-{i}": prefix + encode(model, f" Warm-up {i}?") for i in bursts}
        run_burst(llm, burst, args.max_tokens, BurstTimes())  # the batched paths, untimed
        asked: list[dict[str, list[int]]] = []
        for n in bursts:
            for repeat in range(args.repeats):
                reset_prefix_cache(llm)
                prompts = {
                    f"n{n}-r{repeat}-q{i}": prefix + encode(model, f" Question {repeat}.{i}?")
                    for i in range(n)
                }
                run_burst(llm, prompts, args.max_tokens, results[n])
                asked.append(prompts)
        if config is None:  # the prefix stays in vLLM's prefix cache from here on
            # Computed as the offload arms' host pool got it: bf16 KV of one prefix computed
            # in prompts of other lengths differs in its last bits, enough to flip near-ties.
            reset_prefix_cache(llm)
            llm.generate(warm_up, greedy_params(1), use_tqdm=False)
            for prompts in asked:  # burst by burst: CPU kernels are not batch-invariant
                run_burst(llm, prompts, args.max_tokens, local_hits)
    return results, local_hits.tokens


def parse_sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part.strip()]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"burst sizes of at least 1, not {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="mid", help="model shape (model/shapes.py)")
    parser.add_argument("--model", type=Path, default=None, help="model dir (over --shape)")
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--bursts", type=parse_sizes, default=[1, 4, 16])
    parser.add_argument("--repeats", type=int, default=3, help="bursts of each size a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=8, help="output tokens a request")
    args = parser.parse_args(argv)

    from kvscope.harness.configs import offload_config
    from kvscope.harness.engine import use_in_process_engine
    from kvscope.model.build import ensure_model
    from kvscope.model.shapes import SHAPES

    use_in_process_engine()
    model = args.model or ensure_model(args.shape)
    shape = SHAPES[args.shape] if args.model is None else None
    per_token = shape.kv_bytes_per_token if shape else 4096
    pool = max(256 << 20, 4 * args.prefix_tokens * per_token)
    arms = [
        ("recompute", None),
        ("offload", offload_config(cpu_bytes_to_use=pool)),
        (LOAD_EACH, offload_config(cpu_bytes_to_use=pool, share_loads=False)),
    ]
    results = {arm: {n: BurstTimes() for n in args.bursts} for arm, _ in arms}
    reference: dict[str, list[int]] = {}
    for round_index in range(args.rounds):
        shift = round_index % len(arms)  # each arm first in turn: drift lands on all of them
        for arm, config in arms[shift:] + arms[:shift]:
            measured, local_hits = measure(model, config, args.prefix_tokens, args.bursts, args)
            reference |= local_hits
            for n, times in measured.items():
                merge(results[arm][n], times)
                print(
                    f"round {round_index + 1}: {arm:17s} N={n:2d}: TTFT p50 "
                    f"{statistics.median(times.ttfts_s) * 1000:8.1f} ms, "
                    f"{times.tokens_per_s:7.1f} tokens/s",
                    flush=True,
                )
    report(results, args.shape, args.prefix_tokens)
    for arm in ("offload", LOAD_EACH):
        if differ := token_mismatches(results[arm], reference):
            print(f"{arm}: {len(differ)} prompts' tokens differ from a local hit's: {differ[:5]}")
    # Only the offload arm's requests run in the reference's batches (a burst resumes together);
    # the load-each arm's resume as their copies end, and CPU kernels are not batch-invariant.
    if token_mismatches(results["offload"], reference):
        return 1
    return 0


def merge(into: BurstTimes, times: BurstTimes) -> None:
    into.ttfts_s += times.ttfts_s
    into.walls_s += times.walls_s
    into.output_tokens += times.output_tokens
    into.tokens |= times.tokens


def token_mismatches(offload: dict[int, BurstTimes], reference: dict[str, list[int]]) -> list[str]:
    """Prompts whose greedy tokens from the host pool differ from those from vLLM's own prefix
    cache. Not from a full prefill: on the mid model a question computed over a cached prefix
    and one computed with it in one pass round differently, and greedy picks flip on near-ties
    (vLLM's own prefix cache flips the same ones)."""
    return [
        key
        for times in offload.values()
        for key, tokens in times.tokens.items()
        if reference.get(key) != tokens
    ]


if __name__ == "__main__":
    raise SystemExit(main())
