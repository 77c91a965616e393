"""The demo's Multi connector plus a thread that writes its scheduler-side state to a file.

The soak reads each server's own connector state (host blocks, leases, held blocks) from that
file: the connectors live in vLLM's engine process, out of reach of any HTTP route. Set
KVSCOPE_SOAK_STATE_FILE in the server's environment; the file is rewritten every second.
"""

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from kvscope.connector.multi.connector import KvscopeMultiConnector

STATE_FILE_ENV = "KVSCOPE_SOAK_STATE_FILE"
WRITE_EVERY_S = 1.0


class SoakProbeConnector(KvscopeMultiConnector):
    """KvscopeMultiConnector, unchanged; its scheduler half's state is dumped for the soak."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        path = os.environ.get(STATE_FILE_ENV)
        if role == KVConnectorRole.SCHEDULER and path:
            engine_id = str(self._kv_transfer_config.engine_id)
            threading.Thread(
                target=self._write_forever,
                args=(Path(path), engine_id),
                daemon=True,
                name="kvscope-soak-probe",
            ).start()

    def _write_forever(self, path: Path, engine_id: str) -> None:
        while True:
            with contextlib.suppress(Exception):  # a dict resized mid-read: next round
                manager = getattr(self, "_kv_cache_manager", None)  # bound after start-up
                state = {
                    "engine_id": engine_id,
                    "pid": os.getpid(),
                    "time": time.time(),
                    **connector_state(self._inner, manager),
                }
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(state))
                tmp.replace(path)
            time.sleep(WRITE_EVERY_S)


def connector_state(multi: Any, kv_cache_manager: Any) -> dict[str, Any]:
    """What the Multi's children hold right now, by child name."""
    state: dict[str, Any] = {
        "multi": {"serving": len(multi.scheduler.serving), "loads": len(multi.scheduler.loads)}
    }
    for child in multi.children:
        half = child.connector.scheduler
        if hasattr(half, "pool"):
            state[child.name] = offload_state(half)
        elif hasattr(half, "held_for_readers"):
            state[child.name] = {
                "held": {r: half._lease_ids.get(r, 0) for r in list(half.held_for_readers)},
                "pulling": sorted(half.pulling),
                "lookups": len(half.lookups),
                "leases_acquired": half.stats["held"],
            }
    block_pool = getattr(kv_cache_manager, "block_pool", None)
    if block_pool is not None:  # one block is vLLM's permanent null block
        state["device_blocks_used"] = (
            block_pool.num_gpu_blocks - 1 - block_pool.get_num_free_blocks()
        )
    return state


def offload_state(offload: Any) -> dict[str, Any]:
    """Committed host blocks (id -> compact hash), leases, pinned blocks, work in flight."""
    from kvscope.connector.cpu_offload.host_pool import BlockState
    from kvscope.traces.attribute_values import compact_hash

    pool = offload.pool
    stored, pinned, pending = {}, [], 0
    for host_block_id in range(pool.num_blocks):
        key = pool.key_of(host_block_id)
        if key is None:
            continue
        if pool.state_of(key) is BlockState.COMMITTED:
            stored[host_block_id] = compact_hash(key)
        else:
            pending += 1
        if pool.is_pinned(host_block_id):
            pinned.append(host_block_id)
    return {
        "stored": stored,
        "pinned": pinned,
        "pending_blocks": pending,
        "leases": sorted(lease.lease_id for lease in offload.leases.active()),
        "leases_acquired": offload.leases.counters().acquired,
        "requests": len(offload.requests),
        "stores_in_flight": len(offload.stores.in_flight),
    }
