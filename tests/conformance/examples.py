"""Arguments vLLM passes to connector hooks and answers a connector gives, as vLLM's own objects."""

from dataclasses import dataclass
from typing import Any, Final

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.metrics.cache_hit_source import CacheHitSource
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

from tests.connector.multi.fake_children import SummedStats

EXTERNAL_TOKENS: Final = 32
"""The external hit every recording connector reports: one block at block_size 32."""


@dataclass(frozen=True)
class Token:
    """A value no wrapper makes up: it reaches the inner connector only if passed through."""

    name: str


def request() -> Request:
    return Request("req-0", list(range(64)), SamplingParams(max_tokens=1), None)


def blocks() -> KVCacheBlocks:
    return KVCacheBlocks(([KVCacheBlock(1), KVCacheBlock(2)],))


def example_args() -> dict[str, Any]:
    """One value per parameter name of vLLM's connector API (an unknown name gets a Token)."""
    return {
        "request": request(),
        "num_computed_tokens": 0,
        "num_external_tokens": EXTERNAL_TOKENS,
        "blocks": blocks(),
        "scheduler_output": SchedulerOutput.make_empty(),
        "connector_output": KVConnectorOutput(finished_sending={"req-1"}),
        "block_ids": [1, 2],
        "kv_caches": {"model.layers.0.attn": torch.zeros(2, 2, 32, 64)},
        "layer_name": "model.layers.0.attn",
        "finished_req_ids": {"req-2"},
        "metadata": {0: Token("handshake")},
        "partial_tail_offloads": [Token("tail")],
    }


ARGS_BY_MEMBER: Final = {
    "request_finished_all_groups": {"block_ids": ([1, 2],)},
    "set_xfer_handshake_metadata_pp_aware": {"metadata": {(0, 0): Token("handshake")}},
}
"""Where one member takes a parameter name in another shape than the rest."""


def example_answers() -> dict[str, Any]:
    """What a recording connector answers, per member: values whose combination over one
    child (any, all, first, merge: vLLM's MultiConnector's rules) is the value itself."""
    return {
        "get_num_new_matched_tokens": (EXTERNAL_TOKENS, True),
        "get_external_cache_hit_sources": {CacheHitSource.P2P: EXTERNAL_TOKENS},
        "build_connector_meta": Token("connector_metadata"),
        "request_finished": (True, {"remote_block_ids": [1, 2]}),
        "request_finished_all_groups": (True, {"remote_block_ids": [[1, 2]]}),
        "take_events": [Token("event")],
        "reset_cache": True,
        "has_pending_block_frees": True,
        "has_pending_push_work": True,
        "register_finished_partial_tail": True,
        "may_load_async": True,
        "get_loaded_kv_cache_group_ids": (0,),
        "get_finished": ({"req-2"}, {"req-3"}),
        "get_transfer_results": KVConnectorTransferResults({"req-2"}, {"req-3"}),
        "get_block_ids_with_load_errors": {7},
        "get_kv_connector_stats": SummedStats(data={"loaded_blocks": 3}),
        "get_kv_connector_kv_cache_events": Token("kv_cache_events"),
        "build_connector_worker_meta": Token("worker_meta"),
        "get_handshake_metadata": Token("handshake_metadata"),
        "get_finished_count": 3,
        "get_mem_pool_context": Token("mem_pool"),
    }
