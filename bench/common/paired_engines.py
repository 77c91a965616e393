"""Engines kept alive in worker processes and fed the same batches in turn: side-by-side ratios.

Starting one engine per configuration and timing them one after another lets drift on a shared
machine (other jobs starting, caches, frequency) land on one configuration only. Here every
configuration has its own engine process, all alive at once and idle but the one being timed;
each round runs one batch on each, in a rotating order, so a round's ratio compares batches
measured seconds apart. Workers time their own batches: wall clock and process CPU time (the
latter includes the span export thread, so it counts what tracing costs the process).

An engine may also serve several arms: configurations it switches between from batch to batch
(bench/engine/tracing_switch.py turns its tracing off and on), each timed as if it were an engine.
"""

import contextlib
import multiprocessing
import os
import statistics
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 300.0
BATCH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class EngineSpec:
    """One configuration: a name, its kv_transfer_config, and extra environment."""

    name: str
    kv_transfer_config: dict[str, Any] | None
    env: dict[str, str] = field(default_factory=dict)
    # Switched between batches, each an arm timed on its own: TRACED, or any other name for
    # the same engine untraced. An arm's batch ends when its spans are exported, so the
    # traced arm pays for its spans and leaves no export work to the next batch.
    arms: tuple[str, ...] = ()
    # Where to write a sampling profile of each arm's batches (bench/common/profiles.py), if
    # anywhere.
    profile_dir: str | None = None
    # Where to write each arm's hook call times (bench/engine/hook_times.py), if anywhere.
    hook_times_path: str | None = None

    def labels(self) -> list[str]:
        """The names timings are kept under: the arms, or the engine's name."""
        return list(self.arms) or [self.name]


TRACED = "traced"
"""The arm that runs the engine's TracedConnector as loaded; every other arm runs it off."""


@dataclass
class BatchTiming:
    """One batch on one engine."""

    tokens: int
    wall_s: float
    cpu_s: float  # the whole process, span export thread included

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.tokens / self.cpu_s


def _serve(
    spec: EngineSpec, model: str, prompts: list[str], max_tokens: int, reuse: bool, conn: Connection
):
    """Worker process: one engine; answers ('batch', i[, arm]) with a BatchTiming, ('stats',)
    with the span export counters, ('stop',) by exiting. Its environment was set before it
    started."""
    from kvscope.bench.common.profiles import ArmProfiles
    from kvscope.harness.engine import in_process_llm
    from kvscope.harness.oracle import greedy_params
    from kvscope.traces.sdk.configure import configure_tracing, export_counters, flush

    configure_tracing(service_name=f"kvscope-bench-{spec.name}")
    params = greedy_params(max_tokens)
    with in_process_llm(Path(model), spec.kv_transfer_config) as llm:
        if spec.arms:
            from kvscope.bench.engine.tracing_switch import set_traced, traced_connectors

            connectors = traced_connectors(llm)
        llm.generate(prompts[:2], params, use_tqdm=False)  # warm-up
        conn.send("ready")
        served = 0
        profiles = ArmProfiles() if spec.profile_dir else None
        hook_times = None
        if spec.hook_times_path and spec.arms:
            from kvscope.bench.engine.hook_times import HookTimes

            hook_times = HookTimes(connectors)
        while True:
            command, *args = conn.recv()
            if command == "stop":
                if profiles is not None:
                    profiles.write(Path(spec.profile_dir), spec.name)
                if hook_times is not None:
                    hook_times.write(Path(spec.hook_times_path))
                break
            if command == "stats":
                flush(timeout_s=5)
                conn.send(vars(export_counters()))
                continue
            served += 1
            if reuse:  # the same prompts, computed again or served by the connector
                batch = prompts
                llm.reset_prefix_cache()
            else:  # a new first block: every prompt misses everywhere, whichever arm ran it
                batch = [f"Batch {served}. {prompt}" for prompt in prompts]
            arm = args[1] if len(args) > 1 else None
            if arm is not None:
                set_traced(connectors, arm == TRACED)
            profiled = profiles.around(arm or spec.name) if profiles else contextlib.nullcontext()
            timed = hook_times.around(arm) if hook_times else contextlib.nullcontext()
            wall, cpu = time.perf_counter(), time.process_time()
            with profiled, timed:
                outputs = llm.generate(batch, params, use_tqdm=False)
                if arm is not None:
                    flush(timeout_s=30)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
            conn.send(BatchTiming(tokens, wall, cpu))


@contextlib.contextmanager
def _environment(extra: dict[str, str]):
    """os.environ with the in-process engine settings and `extra`, restored afterwards."""
    from kvscope.harness.engine import ENGINE_ENV

    saved = dict(os.environ)
    os.environ.update({**ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", **extra})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class PairedEngines:
    """Starts one worker per spec, runs rounds of batches across them, stops them all.

    Each batch is `prompts` behind a new first block (all misses), or with `reuse` the same
    prompts every time after vLLM's prefix cache is reset (what a KV connector can serve).
    """

    def __init__(
        self,
        specs: list[EngineSpec],
        model: Path,
        prompts: list[str],
        max_tokens: int,
        reuse: bool = False,
        timings: dict[str, list[BatchTiming]] | None = None,
    ):
        self.specs = specs
        # (label, engine, arm) for each timed configuration, in the order specs give them.
        self.arms = [
            (label, spec.name, label if spec.arms else None)
            for spec in specs
            for label in spec.labels()
        ]
        labels = [label for label, _, _ in self.arms]
        if len(set(labels)) != len(labels):
            raise ValueError(f"arm and engine names must be unique: {labels}")
        # `timings`: an earlier session's, to add this one's rounds to (ratios cover both).
        self.timings = timings if timings is not None else {label: [] for label in labels}
        self._args = (str(model), prompts, max_tokens, reuse)
        self._workers: dict[str, tuple[multiprocessing.Process, Connection]] = {}

    def __enter__(self) -> "PairedEngines":
        context = multiprocessing.get_context("spawn")
        try:
            for spec in self.specs:  # one at a time: start-up is the heaviest part
                ours, theirs = context.Pipe()
                process = context.Process(
                    target=_serve, args=(spec, *self._args, theirs), name=f"engine-{spec.name}"
                )
                # A spawned child imports this program's modules (torch among them) before it
                # runs _serve: OMP_NUM_THREADS and the rest must be in its environment at birth.
                with _environment(spec.env):
                    process.start()
                self._workers[spec.name] = (process, ours)
                self._receive(spec.name, START_TIMEOUT_S)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for _, conn in self._workers.values():
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        # A profiled engine writes its profiles before it exits (bench/common/profiles.py).
        stop_timeout_s = 120 if any(spec.profile_dir for spec in self.specs) else 30
        for process, _ in self._workers.values():
            process.join(timeout=stop_timeout_s)
            if process.is_alive():
                process.kill()
                process.join(timeout=10)
        self._workers.clear()

    def _receive(self, name: str, timeout_s: float) -> Any:
        process, conn = self._workers[name]
        if not conn.poll(timeout_s):
            raise TimeoutError(f"engine {name!r} gave no answer within {timeout_s:.0f} s")
        try:
            return conn.recv()
        except EOFError:
            raise RuntimeError(f"engine {name!r} exited (code {process.exitcode})") from None

    def run_rounds(self, rounds: int, on_round=None) -> None:
        """`rounds` batches per arm (or engine), one each per round, in balanced orders: every
        arm runs at every place and after every other arm equally often (what runs just
        before can leave work behind, an export thread say, that slows the next)."""
        orders = balanced_orders(len(self.arms))
        for index in range(rounds):
            for label, engine, arm in [self.arms[i] for i in orders[index % len(orders)]]:
                self._workers[engine][1].send(("batch", index, arm))
                self.timings[label].append(self._receive(engine, BATCH_TIMEOUT_S))
            if on_round:
                on_round(index, {label: self.timings[label][-1] for label, _, _ in self.arms})

    def export_counters(self, name: str) -> dict[str, int]:
        """The engine's span export counters (queued, exported, dropped...)."""
        self._workers[name][1].send(("stats",))
        return self._receive(name, 30)

    def ratios(self, name: str, base: str, cpu: bool = False) -> list[float]:
        """Per-round throughput of `name` over `base` (wall clock, or per CPU second)."""
        rate = (lambda t: t.tokens_per_cpu_s) if cpu else (lambda t: t.tokens_per_s)
        pairs = zip(self.timings[name], self.timings[base], strict=True)
        return [rate(ours) / rate(theirs) for ours, theirs in pairs]

    def median_rate(self, name: str) -> float:
        return statistics.median(t.tokens_per_s for t in self.timings[name])


def balanced_orders(count: int) -> list[list[int]]:
    """A Williams design: orders of range(count) in which each item takes every place, and
    follows every other item, equally often (2 * count orders when count is odd)."""
    first, low, high = [0], 1, count - 1
    while len(first) < count:
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    orders = [[(item + shift) % count for item in first] for shift in range(count)]
    return orders if count % 2 == 0 else orders + [order[::-1] for order in orders]
