"""One trace per request: across scheduler and worker processes, and joining the client's trace."""

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from kvscope.demo.quickstart import traced_example_config
from kvscope.harness.engine import engine_env, in_process_llm
from kvscope.harness.oracle import greedy_params
from kvscope.harness.prompts import DISTINCT
from kvscope.traces import names
from kvscope.traces.sdk.otlp_json import read_spans_file

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def multiprocess_spans(tiny_model, tmp_path_factory):
    """Two passes (store, then load) in a multi-process engine exporting to a spans file."""
    workdir = tmp_path_factory.mktemp("multiprocess")
    spans_file = workdir / "spans.jsonl"
    env = engine_env(
        KVSCOPE_TRACES_FILE=str(spans_file),
        VLLM_ENABLE_V1_MULTIPROCESSING="1",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    config = json.dumps(traced_example_config(workdir / "kv"))
    cmd = [
        sys.executable,
        "-m",
        "kvscope.demo.run_prompts",
        str(tiny_model),
        config,
        *DISTINCT[:2],
        "--passes",
        "2",
        "--executor",
        "mp",
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    first, second = json.loads(result.stdout.strip().splitlines()[-2])
    return first, second, read_spans_file(spans_file)


def test_scheduler_and_worker_spans_come_from_different_processes(multiprocess_spans):
    *_, spans = multiprocess_spans
    origins = defaultdict(set)
    for span in spans:
        if role := span["attributes"].get(names.CONNECTOR_ROLE):
            origins[role].add(span["attributes"][names.SEQ_ORIGIN])
    assert len(origins["scheduler"]) == 1 and len(origins["worker"]) == 1
    assert origins["scheduler"] != origins["worker"]


def test_each_request_has_one_trace_across_processes(multiprocess_spans):
    *_, spans = multiprocess_spans
    traces = defaultdict(set)
    roles = defaultdict(set)
    for span in spans:
        if req_id := span["attributes"].get(names.REQUEST_ID):
            traces[req_id].add(span["trace_id"])
            roles[req_id].add(span["attributes"].get(names.CONNECTOR_ROLE))
    assert len(traces) == 4  # two prompts, two passes
    for req_id in traces:
        assert len(traces[req_id]) == 1, req_id
        assert roles[req_id] == {"scheduler", "worker"}, req_id


def test_second_pass_loads_in_the_worker_process(multiprocess_spans):
    first, second, spans = multiprocess_spans
    assert first == second
    loads = [
        s
        for s in spans
        if s["name"] == names.SPAN_WORKER_REQUEST and s["attributes"].get("kvscope.load.this_step")
    ]
    assert len(loads) == 2
    assert all(any(e[names.TIMELINE_POINT] == "layer_ready" for e in s["events"]) for s in loads)


def test_sequence_numbers_have_no_holes(multiprocess_spans):
    *_, spans = multiprocess_spans
    by_origin = defaultdict(list)
    for span in spans:
        by_origin[span["attributes"][names.SEQ_ORIGIN]].append(span["attributes"][names.SEQ])
    for seqs in by_origin.values():
        assert sorted(seqs) == list(range(len(seqs)))


def test_spans_join_the_clients_w3c_trace(tiny_model, tmp_path, spans):
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    headers = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    with in_process_llm(tiny_model, traced_example_config(tmp_path)) as llm:
        engine = llm.llm_engine
        engine.add_request("client-req", DISTINCT[0], greedy_params(4), trace_headers=headers)
        while engine.has_unfinished_requests():
            engine.step()
    mine = [s for s in spans() if s.attributes.get(names.REQUEST_ID, "").startswith("client-req")]
    assert mine, "spans of the request were exported"
    assert {format(s.context.trace_id, "032x") for s in mine} == {trace_id}
    root = next(s for s in mine if s.name == names.SPAN_REQUEST)
    assert format(root.parent.span_id, "016x") == parent_id


def test_engine_env_never_reaches_out():
    env = engine_env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_NO_USAGE_STATS"] == "1"
    assert env["DO_NOT_TRACK"] == "1" and env["VLLM_HOST_IP"] == "127.0.0.1"
    assert "HF_HUB_OFFLINE" not in os.environ or os.environ["HF_HUB_OFFLINE"] == "1"
