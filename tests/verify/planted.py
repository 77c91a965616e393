"""Broken connectors that kvscope verify must catch: vLLM's ExampleConnector, each with one bug."""

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    align_to_block_size,
)


class ScrambledLoadConnector(ExampleConnector):
    """Loads the right blocks, then reverses the order of the loaded tokens' KV in each layer."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        super().start_load_kv(forward_context, **kwargs)
        if forward_context.attn_metadata is None:
            return
        for request in self._get_connector_metadata().requests:
            if request.is_store:
                continue
            slots = request.slot_mapping
            blocks, offsets = slots // self._block_size, slots % self._block_size
            for layer in forward_context.no_compile_layers.values():
                kv_cache = getattr(layer, "kv_cache", None)
                if kv_cache is not None:
                    kv_cache[blocks, :, offsets] = kv_cache[blocks, :, offsets].flip(0)


class NeverReleasingConnector(ExampleConnector):
    """Says every finished request's blocks are still being sent, and never reports them done:
    vLLM keeps them forever."""

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        super().request_finished(request, block_ids)
        return True, None


class OverClaimingConnector(ExampleConnector):
    """Claims every prompt's full blocks as an external hit, stored or not, and loads only what
    it really stored: the rest of the claimed blocks are whatever they held before."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int):
        claimed = align_to_block_size(len(request.prompt_token_ids or []) - 1, self._block_size)
        return max(claimed - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if self._found_match_for_request(request):
            super().update_state_after_alloc(request, blocks, num_external_tokens)
