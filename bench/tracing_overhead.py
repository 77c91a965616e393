"""Tracing overhead: tokens/s with TracedConnector (aggregated and per-layer) over the same
connector untraced, on one engine configuration and prompts, plus the median cost of one span.

    python -m kvscope.bench.tracing_overhead [--rounds 3] [--prompts 16] [--max-tokens 64]
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from kvscope.demo.quickstart import traced_example_config

CONFIGS = ("untraced", "aggregated", "per_layer")


def connector_config(mode: str, storage: Path) -> dict:
    """ExampleConnector itself, or wrapped by TracedConnector in one of the layer modes."""
    if mode == "untraced":
        return {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": str(storage)}}  # fmt: skip
    return traced_example_config(storage, trace_layer_mode=mode)


def measure_tokens_per_s(
    model: Path, mode: str, prompts: list[str], max_tokens: int, repeats: int
) -> list[float]:
    """tokens/s of `repeats` identical batches on one engine; every batch misses and stores."""
    from kvscope.demo.engine import in_process_llm
    from kvscope.demo.oracle import greedy_params

    rates = []
    with (
        tempfile.TemporaryDirectory() as storage,
        in_process_llm(model, connector_config(mode, Path(storage))) as llm,
    ):
        params = greedy_params(max_tokens)
        llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
        for repeat in range(repeats):
            batch = [f"Batch {repeat}. {prompt}" for prompt in prompts]  # a new first block
            start = time.perf_counter()
            outputs = llm.generate(batch, params, use_tqdm=False)
            elapsed = time.perf_counter() - start
            rates.append(sum(len(o.outputs[0].token_ids) for o in outputs) / elapsed)
    return rates


def median_span_cost_us(samples: int = 20000) -> float:
    """Median wall time of one hook-like span (start, 4 attributes, end) on this provider."""
    from opentelemetry import trace

    tracer = trace.get_tracer("kvscope.bench")
    costs = []
    for i in range(samples):
        start = time.perf_counter_ns()
        with tracer.start_as_current_span("kvscope.hook.bench") as span:
            span.set_attributes({"a": i, "b": "x", "c": True, "d": 1.5})
        costs.append(time.perf_counter_ns() - start)
    return statistics.median(costs) / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the three configs")
    parser.add_argument("--repeats", type=int, default=5, help="timed batches per engine")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)

    from kvscope.demo.engine import use_in_process_engine
    from kvscope.model.build import build_model, default_model_dir

    use_in_process_engine()
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from kvscope.traces.sdk.configure import configure_tracing, export_counters

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    configure_tracing(exporters=[Discard()])
    model = args.model or default_model_dir()
    if not (model / "config.json").exists():
        build_model(model)
    from kvscope.demo.prompts import long_prompt

    prompts = [long_prompt(i, sentences=2 + i % 3) for i in range(args.prompts)]
    rates: dict[str, list[float]] = {mode: [] for mode in CONFIGS}
    for round_index in range(args.rounds):
        for mode in CONFIGS:  # interleaved, so drift on a shared machine hits every config
            batch_rates = measure_tokens_per_s(model, mode, prompts, args.max_tokens, args.repeats)
            rates[mode] += batch_rates
            median = statistics.median(batch_rates)
            print(f"round {round_index + 1}: {mode:10s} {median:8.1f} tokens/s", flush=True)
    base = statistics.median(rates["untraced"])
    print("\n| config | tokens/s (median) | ratio to untraced |\n| --- | --- | --- |")
    for mode in CONFIGS:
        rate = statistics.median(rates[mode])
        print(f"| {mode} | {rate:.1f} | {rate / base:.3f} |")
    print(f"\nmedian cost of one span: {median_span_cost_us():.1f} us")
    print(f"spans exported {export_counters().exported}, dropped {export_counters().dropped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
