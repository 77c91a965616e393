"""The offload connector's KVConnectorStats: counters, gauges, bounded histogram samples, failures.

The data crosses processes (worker -> engine core -> the API server's logger, as msgpack), so
it is a plain, versioned dict of bounded size:

    {"version": 1,
     "counters": {name: number},            # summed over ranks and steps
     "gauges": {name: number},              # the scheduler half's latest snapshot
     "histograms": {name: [sample, ...]},   # per transfer, at most MAX_SAMPLES a name
     "failures": {cause: {outcome: count}}}

Samples beyond MAX_SAMPLES in one interval are counted in counters["samples_dropped"]; the
byte and second counters stay exact either way.
"""

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

STATS_VERSION = 1
MAX_SAMPLES = 256
"""Histogram samples kept per name per interval (one engine step, or one logging interval)."""

COUNTERS = (
    "lookups", "hit_tokens", "miss_tokens", "stored_blocks", "loaded_blocks", "failed_loads",
    "failed_load_blocks", "evicted_blocks", "lease_expiries",
    "load_bytes", "store_bytes", "load_s", "store_s", "samples_dropped",
    "tier_bypasses", "tier_bypassed_lookups",
)  # fmt: skip
GAUGES = ("host_blocks", "host_blocks_used", "host_blocks_pinned", "pending_stores",
          "active_leases", "tier_bypassed")  # fmt: skip
HISTOGRAMS = ("load_seconds", "store_seconds", "load_size_bytes", "store_size_bytes",
              "kv_wait_seconds")  # fmt: skip
FAILURE_CAUSES = ("lease_expired", "lease_expired_during_load", "load_failed", "store_failed")
FAILURE_OUTCOMES = ("released", "kept_pinned", "recomputed", "failed", "left_to_parent",
                    "dropped")  # fmt: skip
_SECTIONS = {"counters": COUNTERS, "gauges": GAUGES, "histograms": HISTOGRAMS}


def empty_data() -> dict[str, Any]:
    return {"version": STATS_VERSION, "counters": {}, "gauges": {}, "histograms": {},
            "failures": {}}  # fmt: skip


@dataclass
class OffloadStats(KVConnectorStats):
    """Counters and failures add up, gauges take the newest, histogram samples concatenate."""

    def __post_init__(self) -> None:
        # A copy: vLLM hands one dict to both its loggers, and aggregate() changes self.data.
        self.data = copied(checked(self.data)) if self.data else empty_data()

    def reset(self) -> None:
        self.data = empty_data()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        theirs = checked(other.data)
        counters = self.data["counters"]
        for name, value in theirs["counters"].items():
            counters[name] = counters.get(name, 0) + value
        self.data["gauges"].update(theirs["gauges"])
        for name, samples in theirs["histograms"].items():
            mine = self.data["histograms"].setdefault(name, [])
            room = max(0, MAX_SAMPLES - len(mine))
            mine.extend(samples[:room])
            if (dropped := len(samples) - room) > 0:
                counters["samples_dropped"] = counters.get("samples_dropped", 0) + dropped
        for cause, outcomes in theirs["failures"].items():
            mine = self.data["failures"].setdefault(cause, {})
            for outcome, count in outcomes.items():
                mine[outcome] = mine.get(outcome, 0) + count
        return self

    def reduce(self) -> dict[str, int | float]:
        """What vLLM's logger prints each interval: totals, gauges, throughput, failures."""
        counters = self.data["counters"]
        reduced: dict[str, int | float] = {**counters, **self.data["gauges"]}
        for direction in ("load", "store"):
            if seconds := counters.get(f"{direction}_s", 0):
                bytes_moved = counters.get(f"{direction}_bytes", 0)
                reduced[f"{direction}_gb_per_s"] = round(bytes_moved / seconds / 1e9, 3)
        for cause, outcomes in self.data["failures"].items():
            for outcome, count in outcomes.items():
                reduced[f"failures[{cause}/{outcome}]"] = count
        return reduced

    def is_empty(self) -> bool:
        data = self.data
        return not (any(data["counters"].values()) or data["gauges"] or data["failures"]
                    or any(data["histograms"].values()))  # fmt: skip


def copied(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": data["version"],
        "counters": dict(data["counters"]),
        "gauges": dict(data["gauges"]),
        "histograms": {name: list(values) for name, values in data["histograms"].items()},
        "failures": {cause: dict(counts) for cause, counts in data["failures"].items()},
    }


def checked(data: Any) -> dict[str, Any]:
    """The stats dict if it has this version's shape and bounds, else ValueError saying why."""
    if not isinstance(data, dict) or data.get("version") != STATS_VERSION:
        version = data.get("version") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"CpuOffloadConnector stats: version {version!r}, expected "
                         f"{STATS_VERSION}: the engine and this process run different "
                         "versions of kvscope")  # fmt: skip
    for section, known in _SECTIONS.items():
        values = data.get(section)
        if not isinstance(values, dict) or not set(values) <= set(known):
            raise ValueError(f"CpuOffloadConnector stats: '{section}' must be a dict with keys "
                             f"from {known}, got {values!r:.200}")  # fmt: skip
    for name, samples in data["histograms"].items():
        if not isinstance(samples, list) or len(samples) > MAX_SAMPLES:
            raise ValueError(f"CpuOffloadConnector stats: histogram {name!r} must be a list of "
                             f"at most {MAX_SAMPLES} samples")  # fmt: skip
    failures = data.get("failures")
    if not isinstance(failures, dict) or not all(
        cause in FAILURE_CAUSES and isinstance(outcomes, dict)
        and set(outcomes) <= set(FAILURE_OUTCOMES)
        for cause, outcomes in failures.items()
    ):  # fmt: skip
        raise ValueError(f"CpuOffloadConnector stats: 'failures' must map causes from "
                         f"{FAILURE_CAUSES} to outcomes from {FAILURE_OUTCOMES}")  # fmt: skip
    return data


class Samples:
    """One half's histogram samples and failures since its last report, bounded."""

    def __init__(self) -> None:
        self.histograms: dict[str, list[float]] = {}
        self.failures: dict[str, dict[str, int]] = {}
        self.dropped = 0

    def observe(self, name: str, value: float) -> None:
        samples = self.histograms.setdefault(name, [])
        if len(samples) < MAX_SAMPLES:
            samples.append(float(value))
        else:
            self.dropped += 1

    def fail(self, cause: str, outcome: str) -> None:
        outcomes = self.failures.setdefault(cause, {})
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    def take(self) -> tuple[dict[str, list[float]], dict[str, dict[str, int]], int]:
        taken = (self.histograms, self.failures, self.dropped)
        self.histograms, self.failures, self.dropped = {}, {}, 0
        return taken


class IntervalReporter:
    """Turns a half's cumulative counters, gauges and samples into one interval's stats."""

    def __init__(self) -> None:
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, float] = {}

    def report(self, counters: dict[str, float], gauges: dict[str, float],
               samples: Samples) -> OffloadStats | None:  # fmt: skip
        """What changed since the last call; None when nothing did."""
        delta = {k: v - self._counters.get(k, 0) for k, v in counters.items()}
        self._counters = dict(counters)
        changed = gauges != self._gauges
        self._gauges = dict(gauges)
        histograms, failures, dropped = samples.take()
        data = empty_data()
        data["counters"] = {k: v for k, v in delta.items() if v}
        if dropped:
            data["counters"]["samples_dropped"] = dropped
        data["histograms"] = {k: v for k, v in histograms.items() if v}
        data["failures"] = failures
        stats = OffloadStats(data=data)
        if stats.is_empty() and not changed:
            return None
        # Every gauge with every report: a report the logger never sees loses no snapshot.
        stats.data["gauges"] = dict(gauges)
        return stats
