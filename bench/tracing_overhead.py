"""Tracing overhead: tokens/s with TracedConnector (aggregated and per-layer) over the same
connector untraced, measured side by side in one run, plus the median cost of one span.

    python -m kvscope.bench.tracing_overhead [--rounds 48] [--sessions 4] [--max-tokens 256]

Four engines (ExampleConnector; TracedConnector around it, aggregated; the same, per-layer; and
ExampleConnector again as a control, whose ratio to the first shows the run's noise) stay alive
in their own processes and take the same batches in turn (bench/paired_engines.py); each of
`--sessions` starts them afresh, in another order. Every
engine exports to one local OTLP/HTTP receiver, so the traced ones pay for encoding and sending
their spans as they would in production.
"""

import argparse
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from kvscope.bench.otlp_sink import HttpSink
from kvscope.bench.paired_engines import EngineSpec, PairedEngines
from kvscope.bench.results import record
from kvscope.demo.quickstart import traced_example_config

TRACED = ("aggregated", "per_layer")
CONTROL = "control"
"""A second untraced engine: its ratio to the first is what noise alone gives in this run."""
TARGET = ">= 0.98"


def connector_config(mode: str, storage: Path) -> dict:
    """ExampleConnector itself, or wrapped by TracedConnector in one of the layer modes."""
    if mode in ("untraced", CONTROL):
        return {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": str(storage)}}  # fmt: skip
    return traced_example_config(storage, trace_layer_mode=mode)


def median_span_cost_us(samples: int = 20000) -> float:
    """Median wall time of one hook-like span (start, 4 attributes, end) on a configured SDK."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from kvscope.traces.sdk.configure import configure_tracing

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    configure_tracing(exporters=[Discard()])
    tracer = trace.get_tracer("kvscope.bench")
    costs = []
    for i in range(samples):
        start = time.perf_counter_ns()
        with tracer.start_as_current_span("kvscope.hook.bench") as span:
            span.set_attributes({"a": i, "b": "x", "c": True, "d": 1.5})
        costs.append(time.perf_counter_ns() - start)
    return statistics.median(costs) / 1000


def prompts_for(count: int) -> list[str]:
    from kvscope.demo.prompts import long_prompt

    return [long_prompt(i, sentences=2 + i % 3) for i in range(count)]


def print_round(index: int, timings: dict) -> None:
    rates = "  ".join(f"{name} {t.tokens_per_s:7.1f}" for name, t in timings.items())
    print(f"round {index + 1}: tokens/s {rates}", flush=True)


def summarize(engines: PairedEngines) -> None:
    print("\n| config | tokens/s (median) | ratio to untraced, median of rounds (min-max) "
          "| per CPU-second | over both untraced engines |\n"
          "| --- | --- | --- | --- | --- |")  # fmt: skip
    print(f"| untraced | {engines.median_rate('untraced'):.1f} | 1.000 | 1.000 | |")
    for mode in (*TRACED, CONTROL):
        wall = engines.ratios(mode, "untraced")
        cpu = engines.ratios(mode, "untraced", cpu=True)
        both = over_both_untraced(engines, mode)
        print(f"| {mode} | {engines.median_rate(mode):.1f} | {statistics.median(wall):.3f} "
              f"({min(wall):.3f}-{max(wall):.3f}) | {statistics.median(cpu):.3f} "
              f"| {statistics.median(both):.3f} |")  # fmt: skip
        if mode == CONTROL:
            record("tracing_overhead", "tokens_per_s_control_over_untraced",
                   statistics.median(wall), note="untraced against itself: the noise")  # fmt: skip
            continue
        target = TARGET if mode == "aggregated" else ""
        record("tracing_overhead", f"tokens_per_s_{mode}_over_untraced",
               statistics.median(wall), target=target)  # fmt: skip
        record("tracing_overhead", f"tokens_per_cpu_s_{mode}_over_untraced",
               statistics.median(cpu))  # fmt: skip
        record("tracing_overhead", f"tokens_per_s_{mode}_over_both_untraced",
               statistics.median(both), target=target,
               note="per round, over the mean of the untraced and control engines")  # fmt: skip


def over_both_untraced(engines: PairedEngines, mode: str) -> list[float]:
    """Per round, `mode`'s tokens/s over the mean of both untraced engines': two identical
    engines differ by a few percent from process to process, and one alone carries that."""
    ours, base, control = ([t.tokens_per_s for t in engines.timings[name]]
                           for name in (mode, "untraced", CONTROL))  # fmt: skip
    return [o / ((b + c) / 2) for o, b, c in zip(ours, base, control, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=48, help="timed batches per engine")
    parser.add_argument(
        "--sessions",
        type=int,
        default=4,
        help="fresh engine processes per run, each config started first once when this is "
        "the number of engines (4); rounds are split among them",
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)

    from kvscope.model.build import build_model, default_model_dir

    model = args.model or default_model_dir()
    if not (model / "config.json").exists():
        build_model(model)
    sink = HttpSink()
    env = {"KVSCOPE_OTLP_ENDPOINTS": sink.endpoint}
    timings: dict = {mode: [] for mode in ("untraced", *TRACED, CONTROL)}
    counters = {mode: Counter() for mode in TRACED}
    rounds = -(-args.rounds // args.sessions)
    with tempfile.TemporaryDirectory() as storage:
        specs = [EngineSpec(mode, connector_config(mode, Path(storage) / mode), env)
                 for mode in timings]  # fmt: skip
        for session in range(args.sessions):
            # Fresh processes each session, started in another order: engines started later
            # ran 2-3% faster per place in the order here (two identical engines differed by
            # 3-9%), and rotating the order gives every config every place once.
            order = specs[session % len(specs) :] + specs[: session % len(specs)]
            print(f"session {session + 1} of {args.sessions}: starting {len(specs)} engines",
                  flush=True)  # fmt: skip
            with PairedEngines(order, model, prompts_for(args.prompts), args.max_tokens,
                               timings=timings) as engines:  # fmt: skip
                engines.run_rounds(rounds, print_round)
                for mode in TRACED:
                    counters[mode].update(engines.export_counters(mode))
        summarize(engines)
    sink.close()
    span_us = median_span_cost_us()
    print(f"\nmedian cost of one span: {span_us:.1f} us")
    record("tracing_overhead", "span_cost_us", span_us, unit="us")
    for mode, counts in counters.items():
        print(f"{mode}: spans exported {counts['exported']}, dropped "
              f"{counts['dropped_queue_full'] + counts['dropped_export_failed']}")  # fmt: skip
    print(f"OTLP receiver: {sink.requests} requests, {sink.bytes / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
