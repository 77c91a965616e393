"""CPU copies of a job's blocks between raw-row tables, in as few torch calls as possible."""

# Why few calls: every torch call made from Python (narrow, view, copy_, ...) lets go of the
# GIL while it runs, and the copy thread must then win it back from the engine's thread. When
# that thread is running Python (vLLM's scheduler, the step's bookkeeping) it keeps the GIL for
# up to the switch interval (5 ms): a job of 32 torch calls took 20-60 ms for a few blocks.
# Slicing a tensor (t[a:b]) is done by the binding itself and keeps the GIL, so a job's views
# cost no wait; its range copies then go in one torch._foreach_copy_, one wait in all.

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvscope.connector.cpu_offload.copy.block_copy import widest_views
from kvscope.connector.cpu_offload.copy.plan import CopyRun


@dataclass(frozen=True)
class RowTables:
    """Both sides' tables, blocks on dim 0, with the widest views of each made once."""

    device: list[torch.Tensor]
    host: list[torch.Tensor]
    wide_device: list[torch.Tensor]  # for gathers: index kernels move an element at a time
    wide_host: list[torch.Tensor]

    @classmethod
    def of(cls, device: Sequence[torch.Tensor], host: Sequence[torch.Tensor]) -> "RowTables":
        wide = [widest_views(d, h) for d, h in zip(device, host, strict=True)]
        return cls(list(device), list(host), [d for d, _ in wide], [h for _, h in wide])


def store_rows(tables: RowTables, runs: Sequence[CopyRun]) -> int:
    """Device -> host, every table of every run; returns the number of copies made."""
    return _copy_rows(tables, runs, store=True)


def load_rows(tables: RowTables, runs: Sequence[CopyRun]) -> int:
    """Host -> device, every table of every run; returns the number of copies made."""
    return _copy_rows(tables, runs, store=False)


def _copy_rows(tables: RowTables, runs: Sequence[CopyRun], store: bool) -> int:
    """Runs of consecutive device blocks: one range copy a table, all in one call. Runs of
    scattered blocks: one gather (store) or scatter (load) a table."""
    targets: list[torch.Tensor] = []
    sources: list[torch.Tensor] = []
    gathers = 0
    for run in runs:
        host_start, host_end = run.host_start, run.host_start + run.num_blocks
        if run.device_start is None:
            ids = run.device_block_ids
            for device, host in zip(tables.wide_device, tables.wide_host, strict=True):
                if store:
                    torch.index_select(device, 0, ids, out=host[host_start:host_end])
                else:
                    device.index_copy_(0, ids, host[host_start:host_end])
            gathers += len(tables.device)
            continue
        device_start, device_end = run.device_start, run.device_start + run.num_blocks
        for device, host in zip(tables.device, tables.host, strict=True):
            device_rows, host_rows = device[device_start:device_end], host[host_start:host_end]
            targets.append(host_rows if store else device_rows)
            sources.append(device_rows if store else host_rows)
    if targets:
        torch._foreach_copy_(targets, sources)
    return len(targets) + gathers
