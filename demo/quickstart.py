"""A short run of the tiny model through vLLM with kvscope's TracedConnector; prints what it saw."""

import tempfile
from collections import Counter
from pathlib import Path

from kvscope.harness.configs import engine_config, traced_child
from kvscope.traces import names

PROMPTS = [
    "The quick brown fox jumps over the lazy dog while the cache keeps every block warm.",
    "A prefill engine computes the prompt and a decode engine pulls its blocks over NIXL.",
    "Operators watch leases, transfers and failures on a live dashboard in the browser.",
    "Every hook of the connector becomes a span, exported over OTLP to the backend.",
]


def traced_example_config(storage: Path, **tracing: str) -> dict:
    """TracedConnector around vLLM's ExampleConnector, which stores KV as files in storage;
    tracing: TracedConnector's own keys (trace_layer_mode, trace_quiet_hooks)."""
    connector = traced_child(
        "ExampleConnector", "traced", registered=False, shared_storage_path=str(storage), **tracing
    )
    return engine_config(connector, policy="fail")  # vLLM's default: a failed load fails


def run_quickstart(model_dir: Path | None, num_prompts: int = 4) -> int:
    from kvscope.harness.engine import in_process_llm, use_in_process_engine
    from kvscope.model.build import build_model, default_model_dir

    use_in_process_engine()
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from kvscope.harness.oracle import greedy_tokens
    from kvscope.traces.sdk.configure import configure_tracing, flush

    model_dir = model_dir or default_model_dir()
    if not (model_dir / "config.json").is_file():
        print(f"building the tiny model in {model_dir} ...", flush=True)
        build_model(model_dir)
    spans = InMemorySpanExporter()
    configure_tracing(exporters=[spans])
    # Three sentences a prompt: longer than one 32-token block, so there is KV to store.
    prompts = [
        " ".join(PROMPTS[(i + j) % len(PROMPTS)] for j in range(3)) for i in range(num_prompts)
    ]
    with tempfile.TemporaryDirectory(prefix="kvscope-kv-") as storage:
        print("starting vLLM with TracedConnector(ExampleConnector) ...", flush=True)
        with in_process_llm(model_dir, traced_example_config(Path(storage))) as llm:
            print("pass 1: every prompt is new; the connector stores its KV", flush=True)
            first = greedy_tokens(llm, prompts)
            llm.reset_prefix_cache()
            print("pass 2: prefix cache reset; the connector loads the stored KV", flush=True)
            second = greedy_tokens(llm, prompts)
    flush()
    _print_report(spans.get_finished_spans())
    same = first == second
    print(f"greedy tokens equal in both passes: {'yes' if same else 'NO'}")
    return 0 if same else 1


def _print_report(spans) -> None:
    hooks = Counter(s.attributes.get(names.HOOK) for s in spans if s.attributes.get(names.HOOK))
    print(f"\n{len(spans)} spans; hook calls seen by the connector:")
    for hook, count in sorted(hooks.items()):
        print(f"  {hook:36s} {count:6d}")
    print("\nper request (external hit tokens from get_num_new_matched_tokens):")
    for span in spans:
        if span.name == names.SPAN_HOOK_PREFIX + "get_num_new_matched_tokens":
            attrs = span.attributes
            print(
                f"  {attrs.get(names.REQUEST_ID, '?')[:24]:24s} local hit "
                f"{attrs.get(names.TOKENS_LOCAL_HIT, 0):4d}  external hit "
                f"{attrs.get(names.TOKENS_EXTERNAL_HIT, 0):4d}"
            )
