"""Fault injection for loads: fail, slow down, or attack leased blocks, on a seeded plan."""

import dataclasses
import json
import logging
import os
import random
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

logger = logging.getLogger(__name__)

EXTRA_CONFIG_PLAN_KEY = "faults"
EXTRA_CONFIG_PATH_KEY = "faults_path"


@dataclass(frozen=True)
class FaultPlan:
    """What to inject. The all-defaults plan injects nothing."""

    fail_load_every: int = 0  # every Nth load fails; 0 turns it off
    fail_load_probability: float = 0.0  # each load fails with this probability
    fail_load_req_prefix: str = ""  # loads of requests whose id starts with this fail
    load_delay_ms: float = 0.0  # every load finishes at least this much later
    evict_leased: bool = False  # each load first tries to evict its own leased blocks
    lease_timeout_ms: float = 0.0  # leases taken now expire this soon; 0 keeps the configured one
    store_delay_ms: float = 0.0  # every store finishes at least this much later
    # Per worker: {"1": {"load_delay_ms": 300}} overrides keys on the worker of world rank 1.
    by_rank: dict = field(default_factory=dict)
    seed: int = 0

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> "FaultPlan":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown fault plan keys {unknown}; valid keys: {sorted(known)}")
        plan = cls(**config)
        plan.validate()
        return plan

    def validate(self) -> None:
        for plan_field in fields(self):
            value = getattr(self, plan_field.name)
            if not _has_type(value, plan_field.type):
                raise ValueError(
                    f"fault plan key {plan_field.name} must be {plan_field.type.__name__}, "
                    f"got {value!r}"
                )
        if self.fail_load_every < 0:
            raise ValueError(f"fail_load_every must be >= 0, got {self.fail_load_every}")
        if not 0.0 <= self.fail_load_probability <= 1.0:
            raise ValueError(f"fail_load_probability not in [0, 1]: {self.fail_load_probability}")
        if self.load_delay_ms < 0:
            raise ValueError(f"load_delay_ms must be >= 0, got {self.load_delay_ms}")
        for name in ("lease_timeout_ms", "store_delay_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for rank, overrides in self.by_rank.items():
            if not (isinstance(rank, str) and rank.isdigit() and isinstance(overrides, dict)):
                raise ValueError(
                    f"by_rank maps a world rank ('0', '1', ...) to plan keys, got "
                    f"{rank!r}: {overrides!r}"
                )
            if "by_rank" in overrides:
                raise ValueError("by_rank entries cannot nest by_rank")
            FaultPlan.from_dict(overrides)

    def on_rank(self, rank: int | None) -> "FaultPlan":
        """The plan a worker of this world rank follows (None: the scheduler side)."""
        overrides = self.by_rank.get(str(rank)) if rank is not None else None
        return dataclasses.replace(self, by_rank={}, **overrides) if overrides else self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _has_type(value: object, expected: type) -> bool:
    if expected is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


@dataclass(frozen=True)
class LoadFault:
    """The injector's decision for one load."""

    fail_reason: str | None = None
    delay_s: float = 0.0
    evict_leased: bool = False

    @property
    def any(self) -> bool:
        return self.fail_reason is not None or self.delay_s > 0 or self.evict_leased


@dataclass
class FaultCounters:
    loads_seen: int = 0
    failures_injected: int = 0
    delays_injected: int = 0
    evictions_attempted: int = 0
    plan_reloads: int = 0
    plan_errors: int = 0


class FaultInjector:
    """Decides faults per load; the plan can change at runtime by set_plan() or a JSON file.

    The file is re-read when its mtime or size changes. A missing or invalid file leaves the
    current plan in force (an invalid one is logged and counted). Each new plan restarts the
    load count and the random stream, so a seeded plan repeats exactly.
    """

    def __init__(self, plan: FaultPlan | None = None, plan_path: str | os.PathLike | None = None):
        self._lock: threading.Lock = threading.Lock()
        self._plan_path: str | None = os.fspath(plan_path) if plan_path is not None else None
        self._file_version: tuple[int, int] | None = None
        self.rank: int | None = None  # this worker's world rank; None on the scheduler side
        self.counters: FaultCounters = FaultCounters()
        self._install(plan or FaultPlan())
        self.refresh()

    @classmethod
    def from_extra_config(cls, extra_config: Mapping[str, Any] | None) -> "FaultInjector":
        """From kv_connector_extra_config: {"faults": {...plan...}, "faults_path": "x.json"}."""
        extra_config = extra_config or {}
        plan = FaultPlan.from_dict(extra_config.get(EXTRA_CONFIG_PLAN_KEY) or {})
        return cls(plan, extra_config.get(EXTRA_CONFIG_PATH_KEY))

    @property
    def plan(self) -> FaultPlan:
        self.refresh()
        with self._lock:
            return self._plan

    def set_plan(self, plan: FaultPlan | Mapping[str, Any]) -> None:
        if not isinstance(plan, FaultPlan):
            plan = FaultPlan.from_dict(plan)
        plan.validate()
        with self._lock:
            self._install(plan)

    def on_load(self, req_id: str) -> LoadFault:
        """Call once per load, in a deterministic order, to get what to inject into it."""
        self.refresh()
        with self._lock:
            plan = self._plan.on_rank(self.rank)
            self._loads += 1
            draw = self._rng.random()  # drawn every time, so a seed gives the same sequence
            fail_reason = self._fail_reason(plan, req_id, draw)
            fault = LoadFault(fail_reason, plan.load_delay_ms / 1000.0, plan.evict_leased)
            self.counters.loads_seen += 1
            self.counters.failures_injected += fail_reason is not None
            self.counters.delays_injected += fault.delay_s > 0
            self.counters.evictions_attempted += fault.evict_leased
            return fault

    def on_store(self) -> float:
        """The delay to inject into one store, in seconds."""
        return self.plan.on_rank(self.rank).store_delay_ms / 1000.0

    def refresh(self) -> bool:
        """Re-reads the plan file if it changed; True when a new plan was installed."""
        if self._plan_path is None:
            return False
        try:
            stat = os.stat(self._plan_path)
        except FileNotFoundError:
            return False
        version = (stat.st_mtime_ns, stat.st_size)
        if version == self._file_version:
            return False
        self._file_version = version
        try:
            with open(self._plan_path, encoding="utf-8") as plan_file:
                self.set_plan(json.load(plan_file))
        except (OSError, ValueError, TypeError) as exc:
            self.counters.plan_errors += 1
            logger.warning("fault plan %s ignored (%s); fix the file", self._plan_path, exc)
            return False
        self.counters.plan_reloads += 1
        return True

    def _install(self, plan: FaultPlan) -> None:
        self._plan: FaultPlan = plan
        self._rng: random.Random = random.Random(plan.seed)
        self._loads: int = 0

    def _fail_reason(self, plan: FaultPlan, req_id: str, draw: float) -> str | None:
        if plan.fail_load_req_prefix and req_id.startswith(plan.fail_load_req_prefix):
            return f"injected: request id starts with {plan.fail_load_req_prefix!r}"
        if plan.fail_load_every and self._loads % plan.fail_load_every == 0:
            return f"injected: load {self._loads} is a multiple of {plan.fail_load_every}"
        if draw < plan.fail_load_probability:
            return f"injected: probability {plan.fail_load_probability}"
        return None
