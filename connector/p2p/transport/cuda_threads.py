"""The KV cache's CUDA device made current on P2P's own threads, as vLLM's NIXL handshake does.

UCX disables CUDA IPC on a thread that has no valid CUDA context ("when UCX fails to find a
valid cuda context, it will disable any cuda ipc communication", vllm/.../nixl/base_worker.py):
the handshake (add_remote_agent, prep_xfer_dlist, make_connection) and the progress thread must
run with the device set, or VRAM reads between engines fail or take a slow staged path.
"""

from collections.abc import Callable, Iterable

import torch


def device_binder(kv_caches: Iterable[torch.Tensor]) -> Callable[[], None]:
    """What a thread of the transport runs first: sets the KV cache's CUDA device (nothing for
    host memory). Raises if the KV cache spans several devices."""
    devices = {tensor.device for tensor in kv_caches}
    if len(devices) != 1:
        raise ValueError(f"the KV cache is on {len(devices)} devices ({devices}): expected one")
    (device,) = devices
    if device.type != "cuda":
        return _nothing
    index = device.index

    def bind() -> None:
        torch.cuda.set_device(torch.cuda.current_device() if index is None else index)

    return bind


def _nothing() -> None:
    return None
