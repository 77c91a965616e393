"""A child connector for Multi tests without an engine: answers what it is configured to answer
and records the plumbing calls it gets."""

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


@dataclass
class SummedStats(KVConnectorStats):
    """Flat counters that add up: a child's stats of the simplest shape."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return dict(self.data)

    def is_empty(self) -> bool:
        return not any(self.data.values())


@dataclass
class Handshake(KVConnectorHandshakeMetadata):
    owner: str


class RecordingConnector(KVConnectorBase_V1):
    """kv_connector_extra_config: handshake (bool), finished_count (int), stats (dict)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.extra = self._kv_transfer_config.kv_connector_extra_config
        self.calls: list[tuple[str, Any]] = []
        # What the worker half reports next (then nothing): set by the test.
        self.finished: tuple[set[str], set[str]] = (set(), set())
        self.load_errors: set[int] = set()

    def get_handshake_metadata(self):
        return Handshake(self.extra["owner"]) if self.extra.get("handshake") else None

    def set_xfer_handshake_metadata(self, metadata) -> None:
        self.calls.append(("set_xfer_handshake_metadata", metadata))

    def get_finished_count(self) -> int | None:
        return self.extra.get("finished_count")

    def set_host_xfer_buffer_ops(self, copy_operation) -> None:
        self.calls.append(("set_host_xfer_buffer_ops", copy_operation))

    def finish_forward(self) -> None:
        self.calls.append(("finish_forward", None))

    def get_kv_connector_stats(self):
        stats = self.extra.get("stats")
        return SummedStats(data=dict(stats)) if stats else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return SummedStats(data=dict(data or {}))

    def get_finished(self, finished_req_ids):
        finished, self.finished = self.finished, (set(), set())
        return finished

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self.load_errors = self.load_errors, set()
        return errors

    # The abstract hooks: nothing to do without an engine.
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        return None

    def build_connector_meta(self, scheduler_output):
        return None

    def start_load_kv(self, forward_context, **kwargs):
        return None

    def wait_for_layer_load(self, layer_name):
        return None

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return None

    def wait_for_save(self):
        return None
