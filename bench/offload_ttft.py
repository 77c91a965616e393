"""Time to first token with a long shared prefix served from the CPU offload pool, over
recomputing it with no connector, measured side by side in one run.

    python -m kvscope.bench.offload_ttft [--prefix-sentences 40] [--repeats 7]
"""

import argparse
import statistics
import time
from pathlib import Path

from kvscope.bench.results import record

TARGET = "<= 0.5"


def offload_config() -> dict:
    return {
        "kv_connector": "CpuOffloadConnector",
        "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 256 << 20},
    }


def ttft_s(llm, prompt: str) -> float:
    """Wall time of a one-token generation: the prefill (and any KV load) plus one step."""
    from kvscope.demo.oracle import greedy_params

    start = time.perf_counter()
    llm.generate([prompt], greedy_params(1), use_tqdm=False)
    return time.perf_counter() - start


def measure(model: Path, config: dict | None, prefix: str, repeats: int) -> list[float]:
    """TTFTs of prompts sharing `prefix`; the local prefix cache is reset before each."""
    from kvscope.demo.engine import in_process_llm

    with in_process_llm(model, config, max_model_len=2048) as llm:
        ttft_s(llm, prefix + " Warm-up question.")  # with a connector: stores the prefix
        for _ in range(20):  # let the stores commit
            llm.llm_engine.step()
        times = []
        for i in range(repeats):
            llm.reset_prefix_cache()
            times.append(ttft_s(llm, f"{prefix} Question number {i}?"))
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefix-sentences", type=int, default=60, help="shared prefix length")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)

    from kvscope.demo.engine import use_in_process_engine
    from kvscope.demo.prompts import long_prompt
    from kvscope.model.build import build_model, default_model_dir

    use_in_process_engine()
    model = args.model or default_model_dir()
    if not (model / "config.json").exists():
        build_model(model)
    prefix = long_prompt(0, sentences=args.prefix_sentences)
    results: dict[str, list[float]] = {"recompute": [], "offload": []}
    for round_index in range(args.rounds):
        for name, config in (("recompute", None), ("offload", offload_config())):
            results[name] += measure(model, config, prefix, args.repeats)
            print(f"round {round_index + 1}: {name:9s} median TTFT "
                  f"{statistics.median(results[name][-args.repeats:]) * 1000:7.1f} ms",
                  flush=True)  # fmt: skip
    recompute, offload = (statistics.median(results[k]) for k in ("recompute", "offload"))
    print("\n| path | median TTFT (ms) | ratio to recompute |\n| --- | --- | --- |")
    print(f"| recompute, no connector | {recompute * 1000:.1f} | 1.000 |")
    print(f"| prefix from the offload pool | {offload * 1000:.1f} | {offload / recompute:.3f} |")
    print(f"\nhit over recompute: {offload / recompute:.3f} (target {TARGET})")
    record("offload_ttft", "ttft_hit_over_recompute", offload / recompute, "ratio", TARGET,
           f"{offload * 1000:.1f} vs {recompute * 1000:.1f} ms, {args.prefix_sentences} "
           f"sentences of prefix, median of {len(results['offload'])}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
