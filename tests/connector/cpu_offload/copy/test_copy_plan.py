"""plan_runs: the plain-Python planner for short jobs and the numpy one agree, runs and errors."""

import random

import numpy as np
import pytest

from kvscope.connector.cpu_offload.copy.plan import SMALL_JOB, plan_runs


def as_tuples(runs):
    return [(r.host_start, r.num_blocks, r.device_start, r.device_block_ids.tolist()) for r in runs]


def job(seed: int, size: int, pattern: str) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    if pattern == "contiguous":
        return list(range(5, 5 + size)), list(range(size))
    device = rng.sample(range(4 * size + 4), size)
    if pattern == "one host range":  # the usual job: the pool hands out consecutive blocks
        return device, list(range(3, 3 + size))
    host = (
        sorted(rng.sample(range(2 * size + 2), size))
        if pattern == "sorted"
        else (rng.sample(range(2 * size + 2), size))
    )
    return device, host


@pytest.mark.parametrize("pattern", ["contiguous", "one host range", "sorted", "shuffled"])
@pytest.mark.parametrize("size", [0, 1, 2, 7, 64, SMALL_JOB])
def test_short_jobs_plan_as_the_numpy_planner_does(size, pattern):
    for seed in range(5):
        device, host = job(seed, size, pattern)
        limits = (4 * size + 8, 2 * size + 4)
        small = plan_runs(device, host, *limits)
        vectorised = plan_runs(np.array(device, dtype=np.int64), np.array(host, np.int64), *limits)
        assert as_tuples(small) == as_tuples(vectorised)
        assert sum(r.num_blocks for r in small) == size


def test_a_job_in_pieces_gives_a_run_per_host_range():
    runs = plan_runs([7, 8, 3, 9], [0, 1, 5, 2], 16, 8)
    assert as_tuples(runs) == [(0, 3, 7, [7, 8, 9]), (5, 1, 3, [3])]


@pytest.mark.parametrize("as_array", [False, True])
@pytest.mark.parametrize(
    ("device", "host", "message"),
    [
        ([0, 0], [0, 1], "repeated device block ids"),
        ([0, 1], [3, 3], "repeated host block ids"),
        ([0], [99], r"host block id 99 out of range \[0, 4\)"),
        ([-1], [0], "device block id -1 out of range"),
        ([0, 1], [0], "2 device blocks but 1 host blocks"),
        ([2, 2], [0, 1], "repeated device block ids"),
        ([0, 4], [0, 1], r"device block id 4 out of range \[0, 4\)"),
        ([0, 1], [3, 4], r"host block id 4 out of range \[0, 4\)"),
        ([1, 2], [-1, 0], "host block id -1 out of range"),
    ],
)
def test_both_planners_refuse_bad_ids_alike(device, host, message, as_array):
    if as_array:
        device, host = np.array(device, dtype=np.int64), np.array(host, dtype=np.int64)
    with pytest.raises(ValueError, match=message):
        plan_runs(device, host, 4, 4)
