"""Tracing overhead: tokens/s with TracedConnector (aggregated and per-layer) over the same
connector untraced, measured side by side in one run, plus the median cost of one span.

    python -m kvscope.bench.tracing_overhead [--rounds 60] [--max-tokens 256]

One engine per layer mode runs TracedConnector around ExampleConnector and switches it off and
on between batches (bench/tracing_switch.py): untraced, vLLM calls ExampleConnector itself.
Each round runs one batch in each of three arms, in balanced orders: traced, untraced, and
untraced again as a control, whose ratio to the first shows the run's noise. Comparing within
one process leaves out what differs between processes (identical engines in separate
processes differed by 3-9% here). The engine exports to a local OTLP/HTTP receiver, and a
traced batch ends only when its spans are sent: it pays for recording, encoding and sending
them, none of it left to the next batch.
"""

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from kvscope.bench.otlp_sink import HttpSink
from kvscope.bench.paired_engines import TRACED, EngineSpec, PairedEngines
from kvscope.bench.results import record
from kvscope.demo.quickstart import traced_example_config

MODES = ("aggregated", "per_layer")
ARMS = (TRACED, "untraced", "control")
"""The control arm is the untraced engine again: its ratio to untraced is the noise."""
TARGET = ">= 0.98"


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


def summarize(mode: str, engines: PairedEngines) -> None:
    """The mode's row: traced over untraced, per round, and the control arm's row."""
    for arm in ARMS[::2]:
        wall = engines.ratios(arm, "untraced")
        cpu = engines.ratios(arm, "untraced", cpu=True)
        both = over_both_untraced(engines, arm)
        name = mode if arm == TRACED else f"{mode} engine, {arm}"
        print(f"| {name} | {engines.median_rate(arm):.1f} | {statistics.median(wall):.3f} "
              f"({min(wall):.3f}-{max(wall):.3f}) | {statistics.median(cpu):.3f} "
              f"| {statistics.median(both):.3f} |")  # fmt: skip
        if arm != TRACED:
            suffix = "" if mode == "aggregated" else f"_{mode}_engine"
            record("tracing_overhead", f"tokens_per_s_control_over_untraced{suffix}",
                   statistics.median(wall), note="untraced against itself: the noise")  # fmt: skip
            continue
        target = TARGET if mode == "aggregated" else ""
        record("tracing_overhead", f"tokens_per_s_{mode}_over_untraced",
               statistics.median(wall), target=target)  # fmt: skip
        record("tracing_overhead", f"tokens_per_cpu_s_{mode}_over_untraced",
               statistics.median(cpu))  # fmt: skip
        record("tracing_overhead", f"tokens_per_s_{mode}_over_both_untraced",
               statistics.median(both), target=target,
               note="per round, over the mean of the untraced and control arms")  # fmt: skip


def over_both_untraced(engines: PairedEngines, arm: str) -> list[float]:
    """Per round, the arm's tokens/s over the mean of both untraced arms'."""
    ours, base, control = ([t.tokens_per_s for t in engines.timings[name]]
                           for name in (arm, "untraced", "control"))  # fmt: skip
    return [o / ((b + c) / 2) for o, b, c in zip(ours, base, control, strict=True)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=60, help="timed batches per arm")
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
    counters = {}
    table = []
    # ExampleConnector writes every prompt's KV to files: memory-backed storage where there is
    # some keeps the disk's writeback out of the timings.
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as storage:
        for mode in MODES:
            config = traced_example_config(Path(storage) / mode, trace_layer_mode=mode)
            print(f"{mode}: starting the engine", flush=True)
            spec = EngineSpec(mode, config, env, arms=ARMS)
            prompts = prompts_for(args.prompts)
            with PairedEngines([spec], model, prompts, args.max_tokens) as engines:
                engines.run_rounds(args.rounds, print_round)
                counters[mode] = engines.export_counters(mode)
            table.append((mode, engines))
    sink.close()
    print("\n| config | tokens/s (median) | ratio to untraced, median of rounds (min-max) "
          "| per CPU-second | over both untraced arms |\n"
          "| --- | --- | --- | --- | --- |")  # fmt: skip
    for mode, engines in table:
        summarize(mode, engines)
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
