"""A pytest plugin for vLLM's own tests on a release with no CPU build (the 0.34 lane): vLLM's
platform there is UnspecifiedPlatform, which infers no device, so a config that leaves the
device to "auto" names the CPU, as the project's own tests do with DeviceConfig("cpu").
Bare and wrapped runs load it alike. Loaded with `-p kvscope_cpu_device`.
"""

from typing import Any


def pytest_configure(config: Any) -> None:
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
