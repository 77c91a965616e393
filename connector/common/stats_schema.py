"""A connector's KVConnectorStats from a schema: a versioned, bounded, checked plain dict."""

from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

STATS_VERSION = 1
MAX_SAMPLES = 256
"""Histogram samples kept per name per interval (one engine step, or one logging interval)."""

CountersType = TypeVar("CountersType", bound="Counters")


@dataclass(frozen=True)
class StatsSchema:
    """The names one connector's stats may carry; `owner` names it in errors.

    The data crosses processes (worker -> engine core -> the API server's logger, as msgpack), so it
    is a plain dict of bounded size whose keys a schema names:

        {"version": 1,
         "counters": {name: number},            # summed over ranks and steps
         "gauges": {name: number},              # the scheduler half's latest snapshot
         "histograms": {name: [sample, ...]},   # per transfer, at most MAX_SAMPLES a name
         "failures": {cause: {outcome: count}}}

    Samples beyond MAX_SAMPLES in one interval are counted in counters["samples_dropped"]; the byte
    and second counters stay exact either way. Each connector (cpu_offload/stats.py, p2p/stats.py)
    names its keys in a StatsSchema and subclasses SchemaStats with it.
    """

    owner: str
    counters: tuple[str, ...]
    gauges: tuple[str, ...]
    histograms: tuple[str, ...]
    failure_causes: tuple[str, ...]
    failure_outcomes: tuple[str, ...]
    throughputs: tuple[str, ...] = ()
    """Directions d with counters d_bytes and d_s: reduce() prints d_gb_per_s for each."""

    def checked(self, data: Any) -> dict[str, Any]:
        """The stats dict if it has this version's shape and bounds, else ValueError saying why."""
        if not isinstance(data, dict) or data.get("version") != STATS_VERSION:
            version = data.get("version") if isinstance(data, dict) else type(data).__name__
            raise ValueError(
                f"{self.owner} stats: version {version!r}, expected "
                f"{STATS_VERSION}: the engine and this process run different "
                "versions of kvscope"
            )
        sections = {"counters": self.counters, "gauges": self.gauges, "histograms": self.histograms}
        for section, known in sections.items():
            values = data.get(section)
            if not isinstance(values, dict) or not set(values) <= set(known):
                raise ValueError(
                    f"{self.owner} stats: '{section}' must be a dict with keys "
                    f"from {known}, got {values!r:.200}"
                )
        for name, samples in data["histograms"].items():
            if not isinstance(samples, list) or len(samples) > MAX_SAMPLES:
                raise ValueError(
                    f"{self.owner} stats: histogram {name!r} must be a list of "
                    f"at most {MAX_SAMPLES} samples"
                )
        failures = data.get("failures")
        if not isinstance(failures, dict) or not all(
            cause in self.failure_causes
            and isinstance(outcomes, dict)
            and set(outcomes) <= set(self.failure_outcomes)
            for cause, outcomes in failures.items()
        ):
            raise ValueError(
                f"{self.owner} stats: 'failures' must map causes from "
                f"{self.failure_causes} to outcomes from "
                f"{self.failure_outcomes}"
            )
        return data

    def counted_by(self, counters: type[CountersType]) -> type[CountersType]:
        """Class decorator of a half's Counters: every field must be one of this schema's
        counter names, so the schema stays the one list of names the wire dict may carry."""
        unknown = [f.name for f in fields(counters) if f.name not in self.counters]
        if unknown:
            raise TypeError(
                f"{counters.__name__} counts {unknown}, which {self.owner}'s stats schema does "
                f"not name: add them to its counters or rename the fields to one of "
                f"{self.counters}"
            )
        return counters


@dataclass
class Counters:
    """A connector half's cumulative counters as typed fields (a dataclass subclass, checked
    by StatsSchema.counted_by); they become the wire dict only where KVConnectorStats is built."""

    def as_dict(self) -> dict[str, float]:
        """The counters by their wire names, for IntervalReporter.report."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def keys(self) -> list[str]:
        """The wire names: with __getitem__, dict(counters) is a snapshot of them."""
        return [f.name for f in fields(self)]

    def __getitem__(self, name: str) -> float:
        """A counter by its wire name (stats["loaded_blocks"]), as the stats dict names it."""
        if name not in self.keys():
            raise KeyError(f"{type(self).__name__} has no counter {name!r}")
        return getattr(self, name)


def empty_data() -> dict[str, Any]:
    return {
        "version": STATS_VERSION,
        "counters": {},
        "gauges": {},
        "histograms": {},
        "failures": {},
    }


@dataclass
class SchemaStats(KVConnectorStats):
    """Counters and failures add up, gauges take the newest, histogram samples concatenate."""

    SCHEMA: ClassVar[StatsSchema]

    def __post_init__(self) -> None:
        # A copy: vLLM hands one dict to both its loggers, and aggregate() changes self.data.
        self.data = copied(self.SCHEMA.checked(self.data)) if self.data else empty_data()

    def reset(self) -> None:
        self.data = empty_data()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        theirs = self.SCHEMA.checked(other.data)
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
        for direction in self.SCHEMA.throughputs:
            if seconds := counters.get(f"{direction}_s", 0):
                bytes_moved = counters.get(f"{direction}_bytes", 0)
                reduced[f"{direction}_gb_per_s"] = round(bytes_moved / seconds / 1e9, 3)
        for cause, outcomes in self.data["failures"].items():
            for outcome, count in outcomes.items():
                reduced[f"failures[{cause}/{outcome}]"] = count
        return reduced

    def is_empty(self) -> bool:
        data = self.data
        return not (
            any(data["counters"].values())
            or data["gauges"]
            or data["failures"]
            or any(data["histograms"].values())
        )


def copied(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": data["version"],
        "counters": dict(data["counters"]),
        "gauges": dict(data["gauges"]),
        "histograms": {name: list(values) for name, values in data["histograms"].items()},
        "failures": {cause: dict(counts) for cause, counts in data["failures"].items()},
    }


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

    def __init__(self, stats_class: type[SchemaStats]) -> None:
        self.stats_class = stats_class
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, float] = {}

    def report(
        self, counters: dict[str, float], gauges: dict[str, float], samples: Samples
    ) -> SchemaStats | None:
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
        stats = self.stats_class(data=data)
        if stats.is_empty() and not changed:
            return None
        # Every gauge with every report: a report the logger never sees loses no snapshot.
        stats.data["gauges"] = dict(gauges)
        return stats
