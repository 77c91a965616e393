"""A traced connector's KV connector stats: the wrapped connector's, named by its class."""

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from kvscope.connector.child_config import child_transfer_config

if TYPE_CHECKING:
    from vllm.config import VllmConfig

TRACED_STATS_VERSION: Final = 1
"""Version of TracedStats.to_dict(), which vLLM ships from the engine to the logger process."""

MAX_NAME: Final = 256
"""Longest connector class or module name accepted from a stats payload."""


@dataclass
class TracedStats(KVConnectorStats):
    """The wrapped connector's stats, unchanged, with the class that made them.

    vLLM's logger process builds no connector: it rebuilds the stats with the configured
    class's build_kv_connector_stats, which for TracedConnector cannot know the wrapped class
    without a config. to_dict() names it; TracedConnector.build_kv_connector_stats hands the
    wrapped class's own payload to that class, so what is logged and exported is the bare
    connector's.
    """

    inner: KVConnectorStats | None = None
    kv_connector: str = ""
    module_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": TRACED_STATS_VERSION,
            "kv_connector": self.kv_connector,
            "kv_connector_module_path": self.module_path,
            "stats": self.inner.to_dict(),
        }

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        other_inner = other.inner if isinstance(other, TracedStats) else other
        self.inner = self.inner.aggregate(other_inner)
        return self

    def reset(self) -> None:
        self.inner.reset()

    def reduce(self) -> dict[str, int | float]:
        return self.inner.reduce()

    def is_empty(self) -> bool:
        return self.inner.is_empty()


def traced_stats(inner: KVConnectorStats | None, inner_type: type) -> TracedStats | None:
    if inner is None:
        return None
    return TracedStats(
        inner=inner, kv_connector=inner_type.__name__, module_path=inner_type.__module__
    )


def stats_payload(data: Any) -> tuple[type, Any]:
    """(the wrapped class, its own stats payload) from TracedStats.to_dict(), or an error that
    says what was wrong."""
    if not isinstance(data, dict) or data.get("version") != TRACED_STATS_VERSION:
        version = data.get("version") if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"TracedConnector stats: version {version!r}, expected {TRACED_STATS_VERSION}: "
            "the engine and this process run different versions of kvscope"
        )
    name, module = data.get("kv_connector"), data.get("kv_connector_module_path")
    if not _short_text(name) or not _short_text(module) or "stats" not in data:
        raise ValueError(
            "TracedConnector stats need kv_connector, kv_connector_module_path and stats"
        )
    config = child_transfer_config(name, module, {})
    return KVConnectorFactory.get_connector_class(config), data["stats"]


def rebuild_stats(data: dict[str, Any] | None) -> KVConnectorStats | None:
    """What the wrapped class's build_kv_connector_stats makes of its own payload."""
    if data is None:
        return None
    inner_class, payload = stats_payload(data)
    return inner_class.build_kv_connector_stats(data=payload)


class TracedPromMetrics(KVConnectorPromMetrics):
    """The wrapped connector's Prometheus metrics, observing the wrapped connector's payload."""

    def __init__(
        self,
        vllm_config: "VllmConfig",
        metric_types: dict,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        inner: KVConnectorPromMetrics,
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.inner = inner

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        _, payload = stats_payload(transfer_stats_data)
        self.inner.observe(payload, engine_idx)


def _short_text(value: Any) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_NAME
