"""The MultiConnector's KV connector stats and Prometheus metrics: each child's, by child name."""

from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import MultiKVConnectorStats

from kvscope.connector.multi.children import child_class, child_configs, child_vllm_config

STATS_VERSION = 1
"""Version of MultiStats.to_dict(), which vLLM ships from the engine to the logger process."""

MAX_CHILDREN = 64
MAX_NAME = 256


@dataclass
class MultiStats(MultiKVConnectorStats):
    """vLLM's MultiKVConnectorStats, keyed by child name (two children of one class stay
    apart). to_dict() also names each child's connector as the config did: the logger process
    builds no connector, and rebuilds each child's stats with that connector's class."""

    # child name -> (kv_connector, kv_connector_module_path)
    connectors: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def add(self, name: str, connector: tuple[str, str | None], stats: KVConnectorStats) -> None:
        self.connectors[name] = connector
        self.data[name] = self.data[name].aggregate(stats) if name in self.data else stats

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        super().aggregate(other)
        self.connectors.update(getattr(other, "connectors", {}))
        return self

    def to_dict(self) -> dict[str, Any]:
        children = {}
        for name, stats in self.data.items():
            kv_connector, module_path = self.connectors.get(name, (name, None))
            children[name] = {
                "kv_connector": kv_connector,
                "kv_connector_module_path": module_path,
                "stats": stats.to_dict(),
            }
        return {"version": STATS_VERSION, "children": children}


def rebuild_stats(data: dict[str, Any] | None) -> MultiStats:
    """MultiStats from MultiStats.to_dict() (as the logger process receives it), each child's
    stats rebuilt by its own connector class's build_kv_connector_stats."""
    if data is None:
        return MultiStats()
    children = _checked_children(data)
    stats = MultiStats()
    for name, entry in children.items():
        connector = (entry["kv_connector"], entry.get("kv_connector_module_path"))
        child_stats = entry["stats"]
        if not isinstance(child_stats, KVConnectorStats):
            config = {"kv_connector": connector[0], "kv_connector_module_path": connector[1]}
            child_stats = child_class(config).build_kv_connector_stats(data=child_stats)
        if child_stats is not None:  # a connector that cannot rebuild its stats: not logged
            stats.add(name, connector, child_stats)
    return stats


def _checked_children(data: Any) -> dict[str, dict[str, Any]]:
    """The children part of MultiStats.to_dict(), refused with what was wrong."""
    if not isinstance(data, dict) or data.get("version") != STATS_VERSION:
        version = data.get("version") if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"KvscopeMultiConnector stats: version {version!r}, expected {STATS_VERSION}: "
            "the engine and this process run different versions of kvscope"
        )
    children = data.get("children")
    if not isinstance(children, dict) or len(children) > MAX_CHILDREN:
        raise ValueError(
            f"KvscopeMultiConnector stats: 'children' must be a dict of at most "
            f"{MAX_CHILDREN} entries"
        )
    for name, entry in children.items():
        entry = entry if isinstance(entry, dict) else {}
        module = entry.get("kv_connector_module_path")
        if not (
            _short_text(name)
            and _short_text(entry.get("kv_connector"))
            and (module is None or _short_text(module))
            and "stats" in entry
        ):
            raise ValueError(
                f"KvscopeMultiConnector stats: child {str(name)[:MAX_NAME]!r} "
                "needs kv_connector, kv_connector_module_path and stats"
            )
    return children


def _short_text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME


class MultiPromMetrics(KVConnectorPromMetrics):
    """Each child's Prometheus metrics, observed with that child's part of the stats."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues, children):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.children: dict[str, KVConnectorPromMetrics] = children

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, entry in _checked_children(transfer_stats_data).items():
            if (metrics := self.children.get(name)) is not None:
                metrics.observe(entry["stats"], engine_idx)


def build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues):
    """A MultiPromMetrics over the children that have metrics, or None when none has."""
    outer = vllm_config.kv_transfer_config
    by_class: dict[type, KVConnectorPromMetrics | None] = {}
    children: dict[str, KVConnectorPromMetrics] = {}
    for config in child_configs(outer.kv_connector_extra_config or {}, outer.kv_role):
        cls = child_class(config, outer)
        # A metric name registers once per process: children of one class share theirs.
        if cls not in by_class:
            child_config = child_vllm_config(config, vllm_config)
            by_class[cls] = cls.build_prom_metrics(
                child_config, metric_types, labelnames, per_engine_labelvalues
            )
        if by_class[cls] is not None:
            children[config["name"]] = by_class[cls]
    if not children:
        return None
    return MultiPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues, children)
