"""Plans a copy job: (device, host) block id pairs grouped into runs of consecutive host ids."""

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import torch


@dataclass(frozen=True)
class CopyRun:
    """Blocks that land on consecutive host block ids, with their device block ids."""

    host_start: int
    num_blocks: int
    device_start: int | None  # set when the device ids are consecutive too: a plain slice copy
    scattered_ids: torch.Tensor | None = None  # int64, when device_start is None
    # The same ids as a list, where planning had one: splitting reads it without a torch call.
    scattered_list: list[int] | None = field(default=None, compare=False, repr=False)

    @property
    def device_block_ids(self) -> torch.Tensor:
        """The run's device block ids, int64; moved to the KV device before a gather."""
        if self.scattered_ids is not None:
            return self.scattered_ids
        assert self.device_start is not None
        return torch.arange(self.device_start, self.device_start + self.num_blocks)


def plan_runs(
    device_block_ids: Sequence[int],
    host_block_ids: Sequence[int],
    num_device_blocks: int,
    num_host_blocks: int,
) -> list[CopyRun]:
    """Groups (device, host) pairs into host-contiguous runs; raises on bad or repeated ids.

    A job of up to SMALL_JOB blocks is planned in plain Python; a larger one in numpy, so a
    job of a thousand small blocks does not spend longer planning than copying. A job comes
    right after a copy or a forward pass has evicted the caches: planning 64 blocks then took
    250-400 us with torch operations, 140-165 us in numpy and 12 us in plain Python.
    """
    lists = not isinstance(device_block_ids, torch.Tensor | np.ndarray) and not isinstance(
        host_block_ids, torch.Tensor | np.ndarray
    )
    if lists and len(device_block_ids) <= SMALL_JOB:
        return _plan_small(device_block_ids, host_block_ids, num_device_blocks, num_host_blocks)
    device_ids = _checked_ids("device", device_block_ids, num_device_blocks)
    host_ids = _checked_ids("host", host_block_ids, num_host_blocks)
    if len(device_ids) != len(host_ids):
        raise ValueError(f"{len(device_ids)} device blocks but {len(host_ids)} host blocks")
    if len(host_ids) == 0:
        return []
    if not _is_sorted(host_ids):
        order = np.argsort(host_ids, kind="stable")
        host_ids, device_ids = host_ids[order], device_ids[order]
    device_tensor = torch.from_numpy(device_ids)
    device_steps_off = np.diff(device_ids) != 1
    host_breaks = np.flatnonzero(np.diff(host_ids) != 1) + 1
    if len(host_breaks) == 0:  # the usual job: one host range
        consecutive = not device_steps_off.any()
        device_start = int(device_ids[0]) if consecutive else None
        ids = device_tensor if device_start is None else None
        return [CopyRun(int(host_ids[0]), len(host_ids), device_start, ids)]
    starts = np.concatenate(([0], host_breaks))
    ends = np.concatenate((host_breaks, [len(host_ids)]))
    # device_gaps[i]: how many device-id steps up to position i are not +1.
    device_gaps = np.concatenate(([0], device_steps_off.cumsum()))
    consecutive = device_gaps[ends - 1] == device_gaps[starts]
    columns = (starts, ends, host_ids[starts], device_ids[starts], consecutive)
    return [
        CopyRun(
            host_start=host_start,
            num_blocks=end - start,
            device_start=device_start if is_consecutive else None,
            scattered_ids=None if is_consecutive else device_tensor[start:end],
        )
        for start, end, host_start, device_start, is_consecutive in zip(
            *(column.tolist() for column in columns), strict=True
        )
    ]


SMALL_JOB: Final = 256
"""Jobs up to this many blocks are planned without numpy (see plan_runs)."""


def _plan_small(
    device_block_ids: Sequence[int],
    host_block_ids: Sequence[int],
    num_device_blocks: int,
    num_host_blocks: int,
) -> list[CopyRun]:
    """plan_runs for a short job, in plain Python: the same runs, the same errors."""
    limits = (num_device_blocks, num_host_blocks)
    if (run := _one_host_range(device_block_ids, host_block_ids, *limits)) is not None:
        return [run]
    device_ids = _checked_small("device", device_block_ids, num_device_blocks)
    host_ids = _checked_small("host", host_block_ids, num_host_blocks)
    if len(device_ids) != len(host_ids):
        raise ValueError(f"{len(device_ids)} device blocks but {len(host_ids)} host blocks")
    if not host_ids:
        return []
    if any(b <= a for a, b in zip(host_ids, host_ids[1:], strict=False)):
        pairs = sorted(zip(host_ids, device_ids, strict=True))
        host_ids, device_ids = [h for h, _ in pairs], [d for _, d in pairs]
    device_tensor = torch.frombuffer(array("q", device_ids), dtype=torch.int64)
    runs: list[CopyRun] = []
    start = 0
    for end in range(1, len(host_ids) + 1):
        if end < len(host_ids) and host_ids[end] == host_ids[end - 1] + 1:
            continue
        first = device_ids[start]
        consecutive = device_ids[start:end] == list(range(first, first + end - start))
        whole = start == 0 and end == len(host_ids)
        if consecutive:
            runs.append(CopyRun(host_ids[start], end - start, first))
        else:
            ids = device_tensor if whole else device_tensor[start:end]
            runs.append(CopyRun(host_ids[start], end - start, None, ids))
        start = end
    return runs


def _one_host_range(
    device_block_ids: Sequence[int],
    host_block_ids: Sequence[int],
    num_device_blocks: int,
    num_host_blocks: int,
) -> CopyRun | None:
    """The usual job, one range of host ids, checked by whole-list operations instead of id by
    id (a job comes right after a copy has evicted the caches); None for any other job, bad
    ids included: the general path names what is wrong with them."""
    count = len(host_block_ids)
    if count == 0 or count != len(device_block_ids):
        return None
    try:
        host_start = int(host_block_ids[0])
        device_array = array("q", device_block_ids)  # TypeError for anything but integers
    except (TypeError, ValueError, OverflowError):
        return None
    if host_start < 0 or host_start + count > num_host_blocks:
        return None
    if list(host_block_ids) != list(range(host_start, host_start + count)):
        return None
    device_ids = device_array.tolist()
    device_start = device_ids[0]
    if min(device_ids) < 0 or max(device_ids) >= num_device_blocks:
        return None
    if device_ids == list(range(device_start, device_start + count)):
        return CopyRun(host_start, count, device_start)
    if len(set(device_ids)) != count:
        return None
    ids = torch.frombuffer(device_array, dtype=torch.int64)
    return CopyRun(host_start, count, None, ids, device_ids)


def _checked_small(side: str, block_ids: Sequence[int], limit: int) -> list[int]:
    ids = [int(block_id) for block_id in block_ids]
    if not ids:
        return ids
    low, high = min(ids), max(ids)
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise ValueError(f"{side} block id {bad} out of range [0, {limit})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"repeated {side} block ids in one copy job: {ids}")
    return ids


def _is_sorted(ids: np.ndarray) -> bool:
    return len(ids) < 2 or bool((ids[1:] > ids[:-1]).all())


def _checked_ids(side: str, block_ids: Sequence[int], limit: int) -> np.ndarray:
    if isinstance(block_ids, torch.Tensor):
        ids = block_ids.to("cpu", torch.int64).flatten().numpy().copy()  # never the caller's
    elif len(block_ids) == 0:
        return np.empty(0, dtype=np.int64)
    else:
        ids = np.array(block_ids, dtype=np.int64).reshape(-1)
    if len(ids) == 0:
        return ids
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= limit:
        bad = low if low < 0 else high
        raise ValueError(f"{side} block id {bad} out of range [0, {limit})")
    if len(ids) > 1 and not _is_sorted(ids) and len(np.unique(ids)) != len(ids):
        raise ValueError(f"repeated {side} block ids in one copy job: {ids.tolist()}")
    return ids


DIRECT_RANGES_PER_RUN: Final = 4
"""A scattered run that breaks into at most this many device ranges is copied range by range:
with raw rows each range is one memcpy, cheaper than a gather kernel on the SMs (which
competes with the forward) plus a memcpy."""
DIRECT_RANGE_BYTES: Final = 256 * 2**10
"""...and so is one whose ranges average at least this many bytes a table: a memcpy launch
costs about what moving 256 KiB over PCIe does, so past that direct copies win at any count
(a request's blocks come in runs: 16 blocks of a 64 KiB page are 1 MiB)."""


def split_scattered(
    runs: Sequence[CopyRun],
    row_bytes: int,
    max_ranges: int = DIRECT_RANGES_PER_RUN,
    range_bytes: int = DIRECT_RANGE_BYTES,
) -> list[CopyRun]:
    """Scattered runs whose device ids form few or long consecutive ranges, split into them.

    row_bytes is what one block moves in one table (a layer's page, or all layers' for BL*).
    """
    split: list[CopyRun] = []
    for run in runs:
        if run.device_start is not None or run.num_blocks < 2:
            split.append(run)
            continue
        ids, breaks = _ranges(run.scattered_list or run.device_block_ids)
        num_ranges = len(breaks) + 1
        if num_ranges > max_ranges and run.num_blocks * row_bytes < num_ranges * range_bytes:
            split.append(run)  # many short ranges: one gather beats a memcpy each
            continue
        edges = [0, *breaks, run.num_blocks]
        for start, end in zip(edges, edges[1:], strict=False):
            split.append(CopyRun(run.host_start + start, end - start, ids[start]))
    return split


def split_at_multiples(runs: Sequence[CopyRun], every: int) -> list[CopyRun]:
    """Runs cut where their host block ids cross a multiple of `every` (the edge between two
    registrations of the host memory), so that no copy spans two."""
    split: list[CopyRun] = []
    for run in runs:
        start, end = run.host_start, run.host_start + run.num_blocks
        if start // every == (end - 1) // every:
            split.append(run)
            continue
        edges = [start, *range((start // every + 1) * every, end, every), end]
        for first, last in zip(edges, edges[1:], strict=False):
            offset, count = first - start, last - first
            if run.device_start is not None:
                split.append(CopyRun(first, count, run.device_start + offset))
            else:
                ids = run.device_block_ids[offset : offset + count]
                split.append(CopyRun(first, count, None, ids))
    return split


def _ranges(device_block_ids: torch.Tensor | list[int]) -> tuple[list[int], list[int]]:
    """The ids, and where each consecutive range after the first begins. Short runs in plain
    Python: a job is planned right after a copy evicted the caches, when numpy's first calls
    took ~100 us for 64 ids (and a tensor's tolist ~28 us)."""
    if isinstance(device_block_ids, list):
        ids = device_block_ids
    elif len(device_block_ids) > SMALL_JOB:
        array_ids = device_block_ids.numpy()
        return array_ids.tolist(), (np.flatnonzero(np.diff(array_ids) != 1) + 1).tolist()
    else:
        ids = device_block_ids.tolist()
    return ids, [i for i in range(1, len(ids)) if ids[i] != ids[i - 1] + 1]
