"""Tracing overhead: tokens/s with TracedConnector (aggregated and per-layer) over the same
connector untraced, measured side by side in one run, plus the median cost of one span.

    python -m kvscope.bench.engine.tracing_overhead [--rounds 120] [--max-tokens 256]
        [--profile DIR] [--hook-times DIR]

One engine per layer mode runs TracedConnector around ExampleConnector and switches it off and
on between batches (bench/engine/tracing_switch.py): untraced, vLLM calls ExampleConnector itself.
Each round runs one batch in each of three arms, in balanced orders: traced, untraced, and
untraced again as a control, whose ratio to the first shows the run's noise. Comparing within
one process leaves out what differs between processes (identical engines in separate
processes differed by 3-9% here). The engine exports to a local OTLP/HTTP receiver, and a
traced batch ends only when its spans are sent: it pays for recording, encoding and sending
them, none of it left to the next batch.
"""

import argparse
import re
import statistics
import tempfile
import time
from pathlib import Path

from kvscope.bench.backend.otlp_sink import HttpSink
from kvscope.bench.common.paired_engines import TRACED, EngineSpec, PairedEngines
from kvscope.bench.common.results import record
from kvscope.bench.common.spread import median_interval
from kvscope.demo.quickstart import traced_example_config

MODES = ("aggregated", "per_layer")
ARMS = (TRACED, "untraced", "control")
"""The control arm is the untraced engine again: its ratio to untraced is the noise."""
TARGET = ">= 0.98"


def median_span_cost_us(samples: int = 20000) -> float:
    """Median wall time of one hook-like span (start, 4 attributes, end) on a configured SDK."""
    return span_costs_us(samples)["span_cost_us"]


def span_costs_us(samples: int = 20000) -> dict[str, float]:
    """Median wall time of one span, taken apart: the SDK's bare start and end, the same with
    the attributes a per-layer hook span carries, kvscope's hook span (those attributes, made
    current while the hook runs), and the benchmark's generic span (start_as_current_span and
    4 attributes: `span_cost_us`, kept for comparison with earlier reports)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from kvscope.traces import names
    from kvscope.traces.hook_spans import HookSpans
    from kvscope.traces.sdk.configure import configure_tracing

    class Discard(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    configure_tracing(exporters=[Discard()])
    tracer = trace.get_tracer("kvscope.bench")
    spans = HookSpans("ExampleConnector", "worker", "0", "kv_both")
    layer = {names.LAYER_NAME: "model.layers.0.self_attn.attn"}
    attributes = {**spans.base, names.HOOK: "save_kv_layer", **layer}

    def generic(i: int) -> None:
        with tracer.start_as_current_span("kvscope.hook.bench") as span:
            span.set_attributes({"a": i, "b": "x", "c": True, "d": 1.5})

    def hook(i: int) -> None:
        with spans.hook("save_kv_layer", None, **layer):
            pass

    arms = {
        "span_cost_us": generic,
        "span_cost_sdk_bare_us": lambda i: tracer.start_span("kvscope.hook.x").end(),
        "span_cost_sdk_attributes_us": lambda i: tracer.start_span(
            "kvscope.hook.x", attributes=attributes
        ).end(),
        "span_cost_hook_us": hook,
    }
    costs: dict[str, list[int]] = {name: [] for name in arms}
    for i in range(samples):  # interleaved, so drift hits every arm alike
        for name, action in arms.items():
            start = time.perf_counter_ns()
            action(i)
            costs[name].append(time.perf_counter_ns() - start)
    return {name: statistics.median(values) / 1000 for name, values in costs.items()}


def prompts_for(count: int) -> list[str]:
    from kvscope.harness.prompts import long_prompt

    return [long_prompt(i, sentences=2 + i % 3) for i in range(count)]


def print_round(index: int, timings: dict) -> None:
    rates = "  ".join(f"{name} {t.tokens_per_s:7.1f}" for name, t in timings.items())
    print(f"round {index + 1}: tokens/s {rates}", flush=True)


def summarize(mode: str, engines: PairedEngines, label: str = "") -> None:
    """The mode's row: traced over untraced, per round, with the median's 90% interval and the
    extra wall time a batch; then the control arm's row. A label names another model's run:
    its figures are recorded as `<figure>_<label>`, with no target (the targets are the tiny
    model's)."""

    def figure(metric: str, value: float, **details) -> None:
        if label:
            metric, details = f"{metric}_{label}", {**details, "target": ""}
        record("tracing_overhead", metric, value, **details)

    for arm in ARMS[::2]:
        wall = engines.ratios(arm, "untraced")
        cpu = engines.ratios(arm, "untraced", cpu=True)
        both = over_both_untraced(engines, arm)
        low, high = median_interval(wall)
        extra_ms = extra_ms_per_batch(engines, arm)
        name = mode if arm == TRACED else f"{mode} engine, {arm}"
        print(
            f"| {name} | {engines.median_rate(arm):.1f} | {statistics.median(wall):.3f} "
            f"({low:.3f}-{high:.3f}; {min(wall):.3f}-{max(wall):.3f}) "
            f"| {statistics.median(extra_ms):+.2f} | {statistics.median(cpu):.3f} "
            f"| {statistics.median(both):.3f} |"
        )
        interval = f"median of {len(wall)} rounds, 90% bootstrap interval {low:.3f}-{high:.3f}"
        if arm != TRACED:
            suffix = "" if mode == "aggregated" else f"_{mode}_engine"
            figure(
                f"tokens_per_s_control_over_untraced{suffix}",
                statistics.median(wall),
                note=f"untraced against itself: the noise; {interval}",
            )
            continue
        target = TARGET if mode == "aggregated" else ""
        figure(
            f"tokens_per_s_{mode}_over_untraced",
            statistics.median(wall),
            target=target,
            note=interval,
        )
        figure(f"tokens_per_cpu_s_{mode}_over_untraced", statistics.median(cpu))
        figure(
            f"tokens_per_s_{mode}_over_both_untraced",
            statistics.median(both),
            target=target,
            note="per round, over the mean of the untraced and control arms",
        )
        low_ms, high_ms = median_interval(extra_ms)
        figure(
            f"traced_extra_ms_per_batch_{mode}",
            statistics.median(extra_ms),
            unit="ms",
            note=f"traced batch's wall time minus the untraced one's in the same round; "
            f"{len(extra_ms)} rounds, 90% interval {low_ms:.2f}-{high_ms:.2f}",
        )


def extra_ms_per_batch(engines: PairedEngines, arm: str) -> list[float]:
    """Per round, the arm's batch wall time minus the untraced arm's, in ms: what tracing adds
    in absolute terms, which a model with slower steps divides by more."""
    pairs = zip(engines.timings[arm], engines.timings["untraced"], strict=True)
    return [(ours.wall_s - theirs.wall_s) * 1000 for ours, theirs in pairs]


def over_both_untraced(engines: PairedEngines, arm: str) -> list[float]:
    """Per round, the arm's tokens/s over the mean of both untraced arms'."""
    ours, base, control = (
        [t.tokens_per_s for t in engines.timings[name]] for name in (arm, "untraced", "control")
    )
    return [o / ((b + c) / 2) for o, b, c in zip(ours, base, control, strict=True)]


def label(text: str) -> str:
    """A figure-name suffix: lower-case letters, digits and underscores."""
    if not re.fullmatch(r"[a-z0-9_]+", text):
        raise argparse.ArgumentTypeError(f"{text!r}: use lower-case letters, digits and _")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--rounds",
        type=int,
        default=120,
        help="timed batches per arm (120: a 90%% interval of the median about 0.01 wide here)",
    )
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument(
        "--label",
        type=label,
        default=None,  # argparse type-checks a string default: "" would be refused
        help="a run on another model: its ratios are recorded as <figure>_LABEL (mid_model for "
        "the mid model), beside the tiny model's, and the span costs are not recorded again",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="profile each arm's batches (pyinstrument) into this folder and compare them",
    )
    parser.add_argument(
        "--hook-times",
        type=Path,
        default=None,
        help="time every hook call of each arm (bench/engine/hook_times.py) into this folder",
    )
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
            profile_dir = str(args.profile) if args.profile else None
            hook_times = str(args.hook_times / f"{mode}.json") if args.hook_times else None
            spec = EngineSpec(mode, config, env, ARMS, profile_dir, hook_times)
            prompts = prompts_for(args.prompts)
            with PairedEngines([spec], model, prompts, args.max_tokens) as engines:
                engines.run_rounds(args.rounds, print_round)
                counters[mode] = engines.export_counters(mode)
            table.append((mode, engines))
    sink.close()
    print(
        "\n| config | tokens/s (median) | ratio to untraced, median of rounds (90% interval; "
        "min-max) | extra ms a batch | per CPU-second | over both untraced arms |\n"
        "| --- | --- | --- | --- | --- | --- |"
    )
    for mode, engines in table:
        summarize(mode, engines, args.label or "")
    costs = span_costs_us()
    print(
        f"\nmedian cost of one span: {costs['span_cost_us']:.1f} us (generic); SDK bare "
        f"{costs['span_cost_sdk_bare_us']:.1f}, SDK with a per-layer span's attributes "
        f"{costs['span_cost_sdk_attributes_us']:.1f}, kvscope hook span "
        f"{costs['span_cost_hook_us']:.1f} us"
    )
    if not args.label:  # the same SDK and code whatever the model: recorded by the tiny run
        for name, value in costs.items():
            record("tracing_overhead", name, value, unit="us")
    for mode, counts in counters.items():
        print(
            f"{mode}: spans exported {counts['exported']}, dropped "
            f"{counts['dropped_queue_full'] + counts['dropped_export_failed']}"
        )
    print(f"OTLP receiver: {sink.requests} requests, {sink.bytes / 1e6:.1f} MB")
    if args.profile:
        print_profiles(args.profile)
    if args.hook_times:
        print_hook_times(args.hook_times)
    return 0


def print_profiles(directory: Path) -> None:
    """Per mode: where the traced arm's extra time went, and the control arm's (the noise)."""
    from kvscope.bench.common.profiles import compare

    for mode in MODES:
        for arm in (TRACED, "control"):
            first, second = (directory / f"{mode}-{name}.json" for name in (arm, "untraced"))
            if first.exists() and second.exists():
                print(f"\n{mode}: {arm} against untraced, own time per function\n")
                print(compare(first, second))


def print_hook_times(directory: Path) -> None:
    """Per mode: each hook's calls and time a batch, the traced arm against the untraced."""
    import json

    from kvscope.bench.engine.hook_times import compare

    for mode in MODES:
        path = directory / f"{mode}.json"
        if path.exists():
            print(f"\n{mode}: hook calls, traced arm against untraced\n")
            print(compare(json.loads(path.read_text())))


if __name__ == "__main__":
    raise SystemExit(main())
