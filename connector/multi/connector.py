"""KvscopeMultiConnector: composes KV connectors (kvscope's, vLLM's or any module's), traced;
each child's spans nested under the Multi span of that hook.

    "kv_connector": "KvscopeMultiConnector",
    "kv_connector_module_path": "kvscope.connector.multi.connector",
    "kv_connector_extra_config": {
        "connectors": [
            {"kv_connector": "CpuOffloadConnector",
             "kv_connector_module_path": "kvscope.connector.cpu_offload.connector",
             "kv_connector_extra_config": {"cpu_bytes_to_use": 1073741824}},
            {"name": "nixl", "kv_connector": "NixlConnector", "kv_role": "kv_both",
             "kv_buffer_device": "cpu"},
        ],
        "fallback": true,
    }

A child is in vLLM's MultiConnector format (any KVTransferConfig field, plus kvscope's "name");
what it leaves out it inherits from the Multi, whose kv_role it must share (or be kv_both).
"""

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA

from kvscope.connector.multi.core import MultiCore
from kvscope.traces.instrumented import InstrumentedConnector


class KvscopeMultiConnector(InstrumentedConnector, SupportsHMA):
    """MultiCore inside the hook-span instrumentation.

    Not named MultiConnector: vLLM special-cases that name and reads the children's configs as
    its own (MultiConnector below is the way to use that). So vLLM asks this class alone, before
    reading any config, whether it may turn on the hybrid KV cache manager: SupportsHMA, and a
    child that is not refuses to start when the model has several KV cache groups (see
    MultiCore).
    """

    def build_inner(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> MultiCore:
        return MultiCore(vllm_config, role, kv_cache_config)

    @classmethod
    def inner_class(cls, extra_config: dict[str, Any]) -> type[MultiCore]:
        return MultiCore


MultiConnector = KvscopeMultiConnector
"""KvscopeMultiConnector under the name vLLM checks for: with "kv_connector": "MultiConnector"
and "kv_connector_module_path": "kvscope.connector.multi.connector", vLLM's factory loads this
class (a module path comes before its registry), and vLLM's name checks
(KVTransferConfig.has_connector, which looks into a MultiConnector's children) see the
children: a NixlConnector child gets vLLM's NIXL config checks, a SimpleCPUOffloadConnector
child its pool alignment across ranks. The children must then be in vLLM's strict format:
each sets kv_role and none has a "name" (vLLM builds a KVTransferConfig of each to ask
whether all support the hybrid KV cache manager)."""
