"""vLLM's real Scheduler and its runners' own KV connector plumbing, stepped by hand in the hook
order of each model runner, over real KV tensors a fake forward fills with each block's hash.

The orders are vLLM's functions, not copies of them: `KVConnectorModelRunnerMixin.
_get_kv_connector_output` (model runner V1: wait_for_save, then get_transfer_results; with a
speculator `defer_finalize=True`, and wait_for_save comes after the drafter, in
`finalize_kv_connector`), and model runner V2's `ActiveKVConnector` (vllm/v1/worker/gpu/
kv_connector.py), whose runner zeroes new blocks (`update_requests`) before `pre_forward` calls
handle_preemptions. vLLM 0.34 has only V2, which defers as V1 did (`post_forward(
defer_finalize=True)`, then `finalize_step`): there V1's order skips, naming the release.
"""

import contextlib
import time
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import torch
import vllm
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer import kv_transfer_state
from vllm.forward_context import set_forward_context
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request
from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector

from kvscope.harness import configs, stepped
from kvscope.harness.stepped import ComputedBlock, SteppedEngine

try:
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
except ImportError:  # vLLM 0.34: model runner V1 is gone
    KVConnectorModelRunnerMixin = None

BLOCK = 32
NUM_LAYERS = 2
HEADS, HEAD_DIM = 2, 32
OFFLOAD = configs.OFFLOAD_MODULE


class HookOrder(StrEnum):
    """The worker hook orders of vLLM's model runners."""

    V1 = "v1"  # model runner V1 without a speculator (vLLM 0.32 and 0.33)
    # With a speculator: get_transfer_results before wait_for_save. Model runner V1 in 0.32;
    # V2 from 0.33 on calls the same hooks in the same order (post_forward(defer_finalize=True),
    # then finalize_step after the drafter), which 0.32's ActiveKVConnector cannot yet.
    DEFERRED = "deferred"
    V2 = "v2"  # model runner V2: new blocks zeroed before handle_preemptions


def offload_extra(**extra: Any) -> dict[str, Any]:
    return {"cpu_bytes_to_use": 2 << 20, **extra}


def as_transfer(connector: dict[str, Any]) -> KVTransferConfig:
    """A harness.configs child as the engine's KVTransferConfig, with vLLM's default
    load-failure policy."""
    return KVTransferConfig(**configs.engine_config(connector, policy="fail"))


def offload_transfer(**extra: Any) -> KVTransferConfig:
    return as_transfer(configs.offload_child(**offload_extra(**extra)))


def multi_transfer(**extra: Any) -> KVTransferConfig:
    """kvscope's Multi over two offload children."""
    children = [configs.offload_child(name, **offload_extra(**extra)) for name in ("left", "right")]
    return KVTransferConfig(**configs.multi_config(*children, policy="fail"))


def traced_transfer(**extra: Any) -> KVTransferConfig:
    """TracedConnector over the offload connector, named by its module path."""
    return as_transfer(
        configs.traced_child(
            configs.OFFLOAD_CLASS, connector_module_path=OFFLOAD, **offload_extra(**extra)
        )
    )


class ZeroingKVCacheConfig(KVCacheConfig):
    """A KV cache config whose new blocks vLLM zeroes, as it does for mixed-precision KV or
    Mamba layers: vLLM's scheduler then lists them in new_block_ids_to_zero. (vLLM 0.32 and
    0.33 derive it in a property; 0.34 resolves it into a field, set in kv_cache_config.)"""

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        return True


ZEROING_IS_A_FIELD = not isinstance(vars(KVCacheConfig).get("needs_kv_cache_zeroing"), property)


def kv_cache_config(num_blocks: int, zeroing: bool = False) -> KVCacheConfig:
    spec = FullAttentionSpec(BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.bfloat16)
    subclass = zeroing and not ZEROING_IS_A_FIELD
    cls = ZeroingKVCacheConfig if subclass else KVCacheConfig
    config = stepped.stepped_kv_cache_config(num_blocks, {"layer": spec}, NUM_LAYERS, cls)
    if zeroing and ZEROING_IS_A_FIELD:
        config.needs_kv_cache_zeroing = True
    return config


def vllm_config(
    model: Path, transfer: KVTransferConfig, num_blocks: int, **scheduler: Any
) -> VllmConfig:
    """`scheduler`: SchedulerConfig fields other than the defaults here (max_num_seqs=8)."""
    return stepped.stepped_vllm_config(model, transfer, num_blocks, BLOCK, **scheduler)


def request(req_id: str, prompt: list[int], max_tokens: int) -> Request:
    return stepped.stepped_request(req_id, prompt, max_tokens, BLOCK)


def block_pattern(block_hash: bytes, layer: int) -> torch.Tensor:
    """What the fake forward writes into a block: its content hash's bytes (bf16 holds 0-255
    exactly), so a block copied from or to the wrong place does not look right by chance."""
    values = torch.tensor(list(bytes(block_hash)), dtype=torch.float32) + layer
    cells = HEADS * BLOCK * 2 * HEAD_DIM
    return values.repeat(cells // len(values) + 1)[:cells].view(HEADS, BLOCK, 2 * HEAD_DIM)


class Rig(SteppedEngine):
    """A scheduler and one worker of a connector, stepped in a runner's hook order."""

    def __init__(
        self,
        model: Path,
        transfer: KVTransferConfig,
        num_blocks: int = 96,
        zeroing: bool = False,
        **scheduler: Any,
    ) -> None:
        config = vllm_config(model, transfer, num_blocks, **scheduler)
        kv_config = kv_cache_config(num_blocks, zeroing)
        # V2's wrapper registers the KV caches itself, as its runner builds it.
        super().__init__(config, kv_config, stepped.overlaid_kv_caches(kv_config), register=False)
        self.steps = 0
        with self.as_transfer_group():
            self.v2 = ActiveKVConnector(self.config, self.kv_caches)

    @contextlib.contextmanager
    def as_transfer_group(self) -> Iterator[None]:
        """The worker as vLLM's process-wide KV transfer group, which the runners' code reads."""
        kv_transfer_state._KV_CONNECTOR_AGENT = self.worker
        try:
            yield
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = None

    def step(
        self,
        order: HookOrder,
        before_worker: Callable[[SchedulerOutput], None] | None = None,
    ) -> SchedulerOutput:
        """One engine step. before_worker runs where the runner first touches KV after
        scheduling (V2's update_requests); copies run on as they would (see wait_for_copies)."""
        output = self.scheduler.schedule()
        self.steps += 1
        if before_worker is not None:
            before_worker(output)
        with self.as_transfer_group(), set_forward_context(None, self.config):
            kv_output = self._run_worker(order, output)
        self.finish_step(output, kv_output)
        return output

    def _run_worker(self, order: HookOrder, output: SchedulerOutput) -> KVConnectorOutput:
        """The worker's hooks and the forward in `order`, by vLLM's own runner code."""
        if order is HookOrder.V2:
            if output.total_num_scheduled_tokens == 0:
                return self.v2.no_forward(output).kv_connector_output or KVConnectorOutput()
            self.v2.pre_forward(output)
            self.forward(output)
            self.v2.finish_forward()
            return self.v2.post_forward(output.finished_req_ids) or KVConnectorOutput()
        deferred = order is HookOrder.DEFERRED
        if KVConnectorModelRunnerMixin is None:
            if not deferred:
                pytest.skip(f"vLLM {vllm.__version__} has no model runner V1")
            self.v2.pre_forward(output)
            self.forward(output)
            self.v2.finish_forward()
            kv_output = self.v2.post_forward(output.finished_req_ids, defer_finalize=True)
            self.v2.finalize_step()  # after the drafter proposed
            return kv_output or KVConnectorOutput()
        with KVConnectorModelRunnerMixin._get_kv_connector_output(
            output, defer_finalize=deferred
        ) as kv_output:
            self.forward(output)
        if deferred:
            KVConnectorModelRunnerMixin.finalize_kv_connector()  # after the drafter proposed
        return kv_output

    def write_block(self, block: ComputedBlock) -> None:
        """Each block this step fills gets its content's pattern (full blocks only)."""
        req = self.scheduler.requests[block.req_id]
        if block.index >= len(req.block_hashes):
            return
        for layer in range(NUM_LAYERS):
            pattern = block_pattern(req.block_hashes[block.index], layer)
            self.kv_caches[f"layer.{layer}"][block.block_id] = pattern

    def holds_right_kv(self, req_id: str, num_blocks: int) -> bool:
        """Whether the request's first blocks hold what the forward wrote for their content."""
        req = self.scheduler.requests[req_id]
        block_ids = self.block_ids(req_id)[0]
        return all(
            torch.equal(
                self.kv_caches[f"layer.{layer}"][block_ids[index]].float(),
                block_pattern(req.block_hashes[index], layer),
            )
            for index in range(num_blocks)
            for layer in range(NUM_LAYERS)
        )


def offload_workers(connector: Any) -> list[Any]:
    """The OffloadWorker halves inside a traced offload connector, TracedConnector or Multi."""
    inner = connector.inner
    if hasattr(inner, "children"):
        return [child.connector.worker for child in inner.children]
    return [getattr(inner, "worker", None) or inner.inner.worker]


def wait_for_copies(connector: Any) -> None:
    """Lets every submitted copy end (their results wait for the next poll)."""
    deadline = time.monotonic() + 10
    for worker in offload_workers(connector):
        while worker.copies.num_pending and time.monotonic() < deadline:
            time.sleep(0.001)
    time.sleep(0.005)  # the CPU engine's thread posts a result right after its copy
