"""Telemetry isolation: engine tokens/s with the span destinations down or slow over up, side by
side in one run, with the spans each engine dropped.

    python -m kvscope.bench.engine.telemetry_isolation [--rounds 30] [--prompts 16] [--slow-s 2]

Three engines run the CPU offload connector (traced, aggregated layer spans) and export to two
destinations, as a deployment sends to the kvscope backend (OTLP/HTTP) and to Jaeger (OTLP/gRPC):
both answering at once ("up"), both closed ("down"), both answering late ("slow"). Batches repeat
the same prompts after a prefix-cache reset, so the connector stores, then serves hits: leases,
loads and transfers all emit spans.
"""

import argparse
import statistics
from pathlib import Path

from kvscope.bench.backend.otlp_sink import GrpcSink, HttpSink, closed_endpoint
from kvscope.bench.common.paired_engines import EngineSpec, PairedEngines
from kvscope.bench.common.results import record
from kvscope.bench.engine.offload_ttft import offload_config
from kvscope.bench.engine.tracing_overhead import print_round, prompts_for

TARGET = ">= 0.98"


def destinations(slow_s: float) -> tuple[dict[str, str], list]:
    """KVSCOPE_OTLP_ENDPOINTS per configuration, and the receivers to close afterwards."""
    up = [HttpSink(), GrpcSink()]
    slow = [HttpSink(delay_s=slow_s), GrpcSink(delay_s=slow_s)]
    down = [closed_endpoint("http"), closed_endpoint("grpc")]
    endpoints = {
        "up": ",".join(sink.endpoint for sink in up),
        "down": ",".join(down),
        "slow": ",".join(sink.endpoint for sink in slow),
    }
    return endpoints, up + slow


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=30, help="timed batches per engine")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--slow-s", type=float, default=2.0, help="a slow receiver's delay")
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)

    from kvscope.model.build import build_model, default_model_dir

    model = args.model or default_model_dir()
    if not (model / "config.json").exists():
        build_model(model)
    endpoints, sinks = destinations(args.slow_s)
    specs = [
        EngineSpec(name, offload_config(), {"KVSCOPE_OTLP_ENDPOINTS": endpoint})
        for name, endpoint in endpoints.items()
    ]
    print(f"starting {len(specs)} engines ...", flush=True)
    prompts = prompts_for(args.prompts)
    with PairedEngines(specs, model, prompts, args.max_tokens, reuse=True) as engines:
        engines.run_rounds(args.rounds, print_round)
        counters = {spec.name: engines.export_counters(spec.name) for spec in specs}
    for sink in sinks:
        sink.close()

    print(
        "\n| destinations | tokens/s (median) | ratio to up, median of rounds (min-max) "
        "| per CPU-second | spans exported | spans dropped | still queued |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, counts in counters.items():
        wall = engines.ratios(name, "up")
        cpu = engines.ratios(name, "up", cpu=True)
        dropped = counts["dropped_queue_full"] + counts["dropped_export_failed"]
        pending = counts["queued"] - counts["exported"] - counts["dropped_export_failed"]
        print(
            f"| {name} | {engines.median_rate(name):.1f} | {statistics.median(wall):.3f} "
            f"({min(wall):.3f}-{max(wall):.3f}) | {statistics.median(cpu):.3f} "
            f"| {counts['exported']} | {dropped} | {pending} |"
        )
        record("telemetry_isolation", f"spans_dropped_{name}", dropped, unit="spans")
        if name != "up":
            record(
                "telemetry_isolation",
                f"tokens_per_s_{name}_over_up",
                statistics.median(wall),
                target=TARGET,
            )
    print(
        "(counted per destination: each engine sends every span to both; 'still queued' were\n"
        " waiting for a destination that never answered when the run ended)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
