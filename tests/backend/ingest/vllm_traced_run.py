"""python -m tests.backend.ingest.vllm_traced_run MODEL ENDPOINT STORAGE: a few prompts through an
in-process vLLM with its own OTLP tracing on (--otlp-traces-endpoint ENDPOINT) and the connector
traced (TracedConnector over ExampleConnector); prints the request ids once spans are flushed."""

import json
import os
import sys
from pathlib import Path

PROMPTS = ["The KV cache of a long shared prefix", "Blocks move from host memory back to"]


def main(model: str, endpoint: str, storage: str) -> int:
    from kvscope.harness.engine import ENGINE_ENV, in_process_llm
    from kvscope.harness.oracle import greedy_params

    os.environ.update(ENGINE_ENV, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    config = {
        "kv_connector": "TracedConnector",
        "kv_connector_module_path": "kvscope.connector.traced",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "connector": "ExampleConnector",
            "shared_storage_path": storage,
        },
    }
    with in_process_llm(Path(model), config, otlp_traces_endpoint=endpoint) as llm:
        outputs = llm.generate(PROMPTS, greedy_params(4), use_tqdm=False)
        from kvscope.traces.sdk.configure import flush

        # vLLM's provider, which kvscope joined: its exporter holds every span.
        assert flush(timeout_s=10), "spans not flushed"
    print(json.dumps([output.request_id for output in outputs]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
