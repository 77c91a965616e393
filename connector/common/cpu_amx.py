"""AMX for vLLM's CPU attention: asked of Linux before the first forward, which may not ask."""

import logging

import torch

logger = logging.getLogger(__name__)


def allow_amx() -> bool:
    """Asks Linux to let this process use AMX tiles, where the CPU has them; True if allowed.

    Linux gives a process AMX state only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM); an
    AMX instruction before that is an illegal instruction. vLLM's CPU attention picks its AMX
    kernel by the CPU's flags (bf16, block size a multiple of 32) and never asks: it counts on
    oneDNN having asked in an earlier matrix multiply. An engine whose prompts come whole from a
    connector (a P2P decode side, an offload hit of the whole prompt) may run no such multiply
    before its first attention: its engine core died of SIGILL on the first request (vLLM 0.32,
    torch 2.13, on a Xeon with AMX). Called by the connectors' workers as they register the KV
    cache: the process that runs the forward. Asking twice is harmless.
    """
    init_amx = getattr(torch.cpu, "_init_amx", None)
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)
    if init_amx is None or supported is None or not supported():
        return False
    allowed = bool(init_amx())
    if not allowed:
        logger.warning("the CPU has AMX but Linux refused it to this process")
    return allowed
