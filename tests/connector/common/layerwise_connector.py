"""A connector whose per-layer hooks would matter when its extra config says so (as
LMCache's use_layerwise): the other side for requires_piecewise_for_cudagraph tests."""

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector


class LayerwiseConnector(ExampleConnector):
    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return bool(extra_config.get("use_layerwise", False))
