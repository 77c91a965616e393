"""Runs prompts through a vLLM engine in this process and prints the greedy tokens as JSON.

    python -m kvscope.demo.run_prompts MODEL KV_TRANSFER_CONFIG_JSON PROMPT... [--passes N]

Tests use it to run an engine in a separate process tree (multi-process vLLM), with tracing
configured from the environment like any deployment.
"""

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("kv_transfer_config", help="JSON, or 'null' for no connector")
    parser.add_argument("prompts", nargs="+")
    parser.add_argument("--passes", type=int, default=1, help="runs, prefix cache reset between")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--executor", default=None, help="vLLM distributed_executor_backend")
    parser.add_argument(
        "--dump-offload-state",
        action="store_true",
        help="print the offload pool's state (in-process)",
    )
    args = parser.parse_args(argv)

    from kvscope.harness.engine import ENGINE_ENV, in_process_llm
    from kvscope.harness.oracle import greedy_tokens

    os.environ.update(ENGINE_ENV)
    overrides = {"distributed_executor_backend": args.executor} if args.executor else {}
    config = json.loads(args.kv_transfer_config)
    results = []
    state = None
    with in_process_llm(args.model, config, **overrides) as llm:
        for _ in range(args.passes):
            results.append(greedy_tokens(llm, args.prompts, args.max_tokens))
            llm.reset_prefix_cache()
        if args.dump_offload_state:
            from kvscope.harness.engine_state import offload_state

            for _ in range(5):  # let the last stores commit
                llm.llm_engine.step()
            state = offload_state(llm)
    from dataclasses import asdict

    from kvscope.traces.sdk.configure import export_counters, flush

    flush(timeout_s=5)
    print(json.dumps(results), flush=True)
    print(json.dumps({"telemetry": asdict(export_counters())}), flush=True)
    if state is not None:
        print(json.dumps({"offload_state": state}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
