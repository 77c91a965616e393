"""Runs the scenarios on real in-process engines (one per load failure policy) and judges each."""

import contextlib
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.harness.leaks import engine_leaks
from kvscope.verify import rules
from kvscope.verify.checks import History, Oracle, judge, load_notes
from kvscope.verify.connectors import (
    ConnectorSpec,
    add_fault_paths,
    fault_plan_paths,
    traced_transfer_config,
    with_defaults,
)
from kvscope.verify.driver import environ
from kvscope.verify.hooklog import hook_calls
from kvscope.verify.rules import ScenarioResult, Violation
from kvscope.verify.scenarios import SCENARIOS, Drive, Scenario, write_plan
from kvscope.verify.span_checks import hook_errors
from kvscope.verify.spans import SpanCollector

ENGINE = {"num_gpu_blocks_override": 24, "max_model_len": 512}
"""24 blocks of 32 tokens: the preemption scenario's requests outgrow them."""
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
"""Tensor parallelism on the CPU platform: one core per rank; leak probes sent by RPC."""

Progress = Callable[[str], None]


def stderr_progress(line: str) -> None:
    print(f"[verify] {line}", file=sys.stderr, flush=True)


@dataclass
class Report:
    connector: str
    results: list[ScenarioResult] = field(default_factory=list)
    tensor_parallel_size: int = 1

    @property
    def passed(self) -> bool:
        return all(result.verdict != "FAIL" for result in self.results)


def select(names: list[str] | None) -> list[Scenario]:
    """The scenarios named (all when None), in running order; unknown names are refused."""
    known = sorted({s.name for s in SCENARIOS})
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; known: {', '.join(known)}")
    return [s for s in SCENARIOS if names is None or s.name in names]


def verify(
    spec: ConnectorSpec,
    model: Path,
    tp: int = 1,
    scenarios: list[str] | None = None,
    progress: Progress = stderr_progress,
) -> Report:
    """Every selected scenario on engines with the connector wrapped in TracedConnector."""
    chosen = select(scenarios)
    workdir = tempfile.mkdtemp(prefix="kvscope-verify-")
    spec = add_fault_paths(with_defaults(spec), workdir)
    faults = fault_plan_paths(spec)
    for path in faults:
        write_plan(Path(path), {})
    report = Report(spec.label, tensor_parallel_size=tp)
    with environ(**(TP_ENV if tp > 1 else {})):
        oracle = oracle_tokens(model, chosen, tp, progress)
        collector, history = SpanCollector.attach(), History()
        for policy in ("recompute", "fail"):
            todo = [s for s in chosen if s.policy == policy]
            if not any(faults or not s.needs_faults for s in todo):
                report.results += [_skipped(s) for s in todo]
                continue
            with _Engines(model, traced_transfer_config(spec, policy), tp, progress) as engines:
                for scenario in todo:
                    if scenario.needs_faults and not faults:
                        report.results.append(_skipped(scenario))
                        continue
                    run = _Run(scenario, faults, oracle, collector, history, tp, spec.name)
                    report.results.append(run.execute(engines, progress))
    return report


def _skipped(scenario: Scenario) -> ScenarioResult:
    return ScenarioResult(
        scenario.name,
        scenario.policy,
        skipped="the connector has no failure path kvscope can drive (a FaultPlan file)",
    )


_ORACLES: dict[tuple, list[int]] = {}
"""Oracle tokens by (model, tp, prompt, max_tokens): one process verifying several connectors
starts the no-connector engine once per new prompt set."""


def oracle_tokens(model: Path, chosen: list[Scenario], tp: int, progress: Progress) -> Oracle:
    from kvscope.harness.engine import in_process_llm
    from kvscope.verify.driver import run

    wanted = {
        (w.prompts[i], w.max_tokens) for s in chosen for w in s.waves for i in range(len(w.prompts))
    }
    missing = sorted(key for key in wanted if (str(model), tp, *key) not in _ORACLES)
    if missing:
        progress(f"oracle: {len(missing)} prompts on an engine without a connector")
        # vLLM's default KV cache (no block limit): the same greedy tokens, no preemption.
        with in_process_llm(model, tensor_parallel_size=tp, max_model_len=512) as llm:
            for max_tokens in sorted({m for _, m in missing}):
                prompts = [p for p, m in missing if m == max_tokens]
                ids = [f"oracle.{len(_ORACLES)}.{i}" for i in range(len(prompts))]
                batch = run(llm, ids, prompts, max_tokens)
                for req_id, prompt in zip(ids, prompts, strict=True):
                    _ORACLES[(str(model), tp, prompt, max_tokens)] = batch.results[req_id].tokens
    return {key: _ORACLES[(str(model), tp, *key)] for key in wanted}


class _Engines:
    """The engine under test, started on demand and again after a scenario ended it."""

    def __init__(self, model: Path, config: dict, tp: int, progress: Progress) -> None:
        self.model, self.config, self.tp, self.progress = model, config, tp, progress
        self._context: Any = None
        self.llm: Any = None

    def get(self) -> Any:
        if self.llm is None:
            from kvscope.harness.engine import in_process_llm

            policy = self.config["kv_load_failure_policy"]
            self.progress(f"starting an engine (policy {policy})")
            self._context = in_process_llm(
                self.model, self.config, tensor_parallel_size=self.tp, **ENGINE
            )
            self.llm = self._context.__enter__()
        return self.llm

    def close(self) -> None:
        if self._context is not None:
            context, self._context, self.llm = self._context, None, None
            with contextlib.suppress(Exception):
                context.__exit__(None, None, None)

    def __enter__(self) -> "_Engines":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass
class _Run:
    scenario: Scenario
    faults: list[str]
    oracle: Oracle
    collector: SpanCollector
    history: History
    tp: int
    connector: str  # the wrapped class's name: its outermost hook spans carry it

    def execute(self, engines: _Engines, progress: Progress) -> ScenarioResult:
        scenario = self.scenario
        result = ScenarioResult(scenario.name, scenario.policy)
        progress(f"{scenario.name} (policy {scenario.policy}): {scenario.summary}")
        start = time.monotonic()
        try:
            llm = engines.get()
            self.collector.clear()
            bound_of: dict[str, int] = {}
            drive = Drive(scenario, llm, self.faults, before_wave=self._bounds(bound_of))
            scenario.drive(drive)
            if not drive.ended:
                drive.settle()
            leaks = [] if drive.ended else engine_leaks(llm)
            spans = self.collector.collect()
            for batch in drive.batches:
                self.history.add(batch)
            result.violations = judge(drive, spans, leaks, self.oracle, bound_of, self.connector)
            result.notes = load_notes(spans, self.connector) + drive.notes
            if drive.ended or not drive.settled:
                engines.close()  # shut down or holding blocks: the next one gets a fresh engine
        except Exception as exc:  # noqa: BLE001 (the verdict names it; the run goes on)
            raised = hook_errors(hook_calls(self.collector.collect(), self.connector))
            result.violations += raised or [Violation(rules.ENGINE_ERROR, _error_text(exc))]
            engines.close()
        result.elapsed_s = time.monotonic() - start
        progress(
            f"  {result.verdict} in {result.elapsed_s:.1f} s"
            + "".join(f"\n    {v.rule}: {v.evidence()}" for v in result.violations)
        )
        return result

    def _bounds(self, bound_of: dict[str, int]) -> Callable:
        def before_wave(wave: Any, ids: list[str]) -> None:
            bound_of.update(zip(ids, self.history.bounds(wave.prompts), strict=True))
            # requests of this scenario's earlier waves count as given to the connector
            self.history.sequences += list(wave.prompts)

        return before_wave


def _error_text(exc: BaseException) -> str:
    where = traceback.extract_tb(exc.__traceback__)[-1:]
    place = f" at {where[0].filename.rsplit('/', 1)[-1]}:{where[0].lineno}" if where else ""
    return f"{type(exc).__name__}: {str(exc)[:300]}{place}"
