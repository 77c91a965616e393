"""The scenarios verify runs: waves of greedy requests on a live engine, with resets, aborts,
injected load failures, preemption and a shutdown in between."""

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvscope.verify import driver

SETTLE_S = 10.0
"""How long an idle engine may take to let go of finished requests (stores, delayed frees)."""
VOCAB = 2000
"""Prompt token ids are drawn below this (the tiny model's vocabulary is 2048)."""


@dataclass(frozen=True)
class Wave:
    """Requests added together; each prompt is token ids."""

    tag: str
    prompts: tuple[tuple[int, ...], ...]
    max_tokens: int = 8


@dataclass
class Drive:
    """A scenario running: the engine, what each wave ended as, notes for the report."""

    scenario: "Scenario"
    llm: Any
    fault_paths: list[str]
    batches: list[tuple[Wave, list[str], driver.Batch]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    before_wave: Callable[[Wave, list[str]], None] = lambda wave, ids: None
    settled: bool = True  # every settle let go of every request
    ended: bool = False  # the scenario shut the engine down
    shutdown_error: str = ""

    def ids(self, wave: Wave) -> list[str]:
        return [f"{self.scenario.name}.{wave.tag}.{i}" for i in range(len(wave.prompts))]

    def run(self, index: int, **kwargs: Any) -> driver.Batch:
        wave = self.scenario.waves[index]
        ids = self.ids(wave)
        self.before_wave(wave, ids)
        batch = driver.run(self.llm, ids, wave.prompts, wave.max_tokens, **kwargs)
        self.batches.append((wave, ids, batch))
        return batch

    def settle(self) -> None:
        self.settled = driver.settle(self.llm, SETTLE_S) and self.settled

    def reset(self, reset_connector: bool = False) -> None:
        """Settles, then empties vLLM's prefix cache: only the connector can serve now."""
        self.settle()
        if not driver.reset_prefix_cache(self.llm, reset_connector):
            self.notes.append("vLLM refused to reset its prefix cache (blocks still held)")

    @contextlib.contextmanager
    def faults(self, plan: dict) -> Iterator[None]:
        """The connector's own fault plan files (re-read on each load) say plan for a while."""
        for path in self.fault_paths:
            write_plan(Path(path), plan)
        try:
            yield
        finally:
            for path in self.fault_paths:
                write_plan(Path(path), {})


def write_plan(path: Path, plan: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(plan))
    tmp.replace(path)  # atomic: a connector never reads half a file


@dataclass(frozen=True)
class Scenario:
    name: str
    waves: tuple[Wave, ...]
    drive: Callable[[Drive], None]
    policy: str = "recompute"
    needs_faults: bool = False
    summary: str = ""


def tokens(seed: str, n: int) -> tuple[int, ...]:
    rng = random.Random(seed)
    return tuple(rng.randrange(10, VOCAB) for _ in range(n))


def _store_then_load(drive: Drive) -> None:
    drive.run(0)
    drive.reset()
    drive.run(1)


def _across_reset(drive: Drive) -> None:
    drive.run(0)
    drive.reset(reset_connector=True)  # the connector's reset_cache hook too
    drive.run(1)


def _concurrent(drive: Drive) -> None:
    drive.run(0)
    drive.reset()
    drive.run(1)


def _preemption(drive: Drive) -> None:
    drive.run(0)
    drive.reset()
    batch = drive.run(1)
    if batch.preemptions == 0:
        drive.notes.append("vLLM preempted nothing: the scenario tested no preemption")
    else:
        drive.notes.append(f"{batch.preemptions} preemptions")


def _abort_during_load(drive: Drive) -> None:
    """The first request is aborted after the step that scheduled it (its load in flight:
    kvscope connectors' loads are slowed to 600 ms through their fault plan)."""
    drive.run(0)
    drive.reset()
    steps, first = [0], drive.ids(drive.scenario.waves[1])[0]

    def abort_when() -> list[str]:
        steps[0] += 1
        return [first] if steps[0] == 1 else []

    plan = {"load_delay_ms": 600.0} if drive.fault_paths else {}
    with drive.faults(plan):
        drive.run(1, abort_when=abort_when)


def _failed_load(drive: Drive) -> None:
    drive.run(0)
    drive.reset()
    with drive.faults({"fail_load_every": 1}):
        drive.run(1)


def _shutdown_pending(drive: Drive) -> None:
    """Requests mid-flight when the engine shuts down: it must end promptly, without error."""
    wave = drive.scenario.waves[0]
    driver.add_requests(drive.llm, drive.ids(wave), wave.prompts, wave.max_tokens)
    for _ in range(2):
        drive.llm.llm_engine.step()
    start = time.monotonic()
    try:
        drive.llm.llm_engine.engine_core.shutdown()
    except Exception as exc:  # noqa: BLE001 (the verdict names it)
        drive.shutdown_error = f"shutdown raised {type(exc).__name__}: {exc}"
    elapsed = time.monotonic() - start
    if elapsed > SHUTDOWN_LIMIT_S:
        drive.shutdown_error = f"shutdown took {elapsed:.1f} s (limit {SHUTDOWN_LIMIT_S:.0f} s)"
    drive.notes.append(f"shutdown in {elapsed:.2f} s")
    drive.ended = True


SHUTDOWN_LIMIT_S = 30.0


def _pair(seed: str, n: int, count: int = 2) -> tuple[tuple[int, ...], ...]:
    return tuple(tokens(f"{seed}{i}", n) for i in range(count))


def _shared(seed: str, prefix: int, tail: int, count: int) -> tuple[tuple[int, ...], ...]:
    head = tokens(seed, prefix)
    return tuple(head + tokens(f"{seed}-tail{i}", tail) for i in range(count))


def _partial(seed: str) -> tuple[Wave, Wave]:
    stored = _pair(seed, 100)
    partial = tuple(prompt[:64] + tokens(f"{seed}-new{i}", 40) for i, prompt in enumerate(stored))
    return Wave("store", stored), Wave("partial", partial)


def _twice(seed: str, prompts_fn: Callable[[str], tuple], max_tokens: int = 8) -> tuple:
    prompts = prompts_fn(seed)
    return Wave("first", prompts), Wave("again", prompts, max_tokens)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "cold_miss_then_hit",
        _twice("cold", lambda s: _pair(s, 100)),
        _store_then_load,
        summary="store on a miss, reset vLLM's prefix cache, load the hit",
    ),
    Scenario(
        "partial_hit",
        _partial("partial"),
        _store_then_load,
        summary="prompts sharing two blocks with stored ones",
    ),
    Scenario(
        "hit_across_reset",
        _twice("reset", lambda s: _pair(s, 90)),
        _across_reset,
        summary="prefix cache and connector reset between store and load",
    ),
    Scenario(
        "concurrent_shared_prefix",
        _twice("shared", lambda s: _shared(s, 64, 30, 4)),
        _concurrent,
        summary="four requests sharing a prefix, added together",
    ),
    Scenario(
        "preemption",
        (Wave("store", _pair("preempt", 150, 4), 4), Wave("grow", _pair("preempt", 150, 4), 64)),
        _preemption,
        summary="requests outgrow the KV cache while decoding",
    ),
    Scenario(
        "abort_during_load",
        _twice("abort", lambda s: _pair(s, 100)),
        _abort_during_load,
        summary="a request aborted while its load is in flight",
    ),
    Scenario(
        "failed_load",
        _twice("failrc", lambda s: _pair(s, 100)),
        _failed_load,
        needs_faults=True,
        summary="every load fails (connector's fault plan), recompute",
    ),
    Scenario(
        "failed_load",
        _twice("failf", lambda s: _pair(s, 100)),
        _failed_load,
        policy="fail",
        needs_faults=True,
        summary="every load fails, policy fail",
    ),
    Scenario(
        "shutdown_pending",
        (Wave("pending", _pair("shutdown", 80, 3), 64),),
        _shutdown_pending,
        summary="engine shut down with requests in flight",
    ),
)
"""In running order per policy; shutdown_pending comes last (it ends the engine)."""
