"""A read's path judged: expected and line rate of its UCX lanes, and the three flags."""

import pytest

from kvscope.backend.queries.transport_rates import (
    ABOVE_LINE_RATE,
    DEFAULT_RATES_GBPS,
    TCP_STAGED,
    UNDER_1_GBPS,
    family_of,
    judge,
    rates_from,
)

MIB = 1 << 20


def test_families_of_ucx_transport_names():
    assert family_of("cma/memory") == "cma"
    assert family_of("posix/memory") == "shm"
    assert family_of("rc_mlx5/mlx5_0:1") == "rc"
    assert family_of("cuda_ipc/cuda") == "cuda_ipc"
    assert family_of("mystery/dev0") == "unknown"


def test_a_healthy_memory_copy_on_one_host_raises_nothing():
    path = judge(["cma/memory"], "intra-node", "DRAM", 64 * MIB, 6.0)
    assert path.flags == [] and path.expected_gbps == DEFAULT_RATES_GBPS["cma"][0]


def test_tcp_where_a_faster_lane_should_exist_is_staged():
    assert judge(["tcp/lo"], "intra-node", "DRAM", MIB, 2.0).flags == [TCP_STAGED]
    # GPU memory over TCP between hosts: NVLink or GPUDirect RDMA should carry it.
    assert judge(["tcp/eth0"], "inter-node", "VRAM", MIB, 2.0).flags == [TCP_STAGED]
    # Host memory between hosts over TCP may be all the network has: not flagged.
    assert judge(["tcp/eth0"], "inter-node", "DRAM", MIB, 2.0).flags == []


def test_under_1_gbps_only_for_reads_big_enough_to_judge():
    assert judge(["rc_mlx5/mlx5_0:1"], "inter-node", "VRAM", 64 * MIB, 0.4).flags == [UNDER_1_GBPS]
    assert judge(["rc_mlx5/mlx5_0:1"], "inter-node", "VRAM", 64 * 1024, 0.4).flags == []


def test_above_line_rate_is_a_window_error_and_rails_add_up():
    """sglang#31993: 'well above 100 GB/s' on a 50 GB/s link."""
    one_rail = judge(["rc_mlx5/mlx5_0:1"], "inter-node", "VRAM", 64 * MIB, 120.0)
    assert one_rail.flags == [ABOVE_LINE_RATE] and one_rail.line_gbps == 50.0
    two_rails = judge(["rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1"], "inter-node", "VRAM", MIB, 90.0)
    assert two_rails.line_gbps == 100.0 and two_rails.flags == []


def test_unknown_lanes_have_no_rate_and_no_line_to_beat():
    path = judge([], "unknown", "DRAM", 64 * MIB, 500.0)
    assert path.expected_gbps is None and path.line_gbps is None and path.flags == []


def test_rates_are_configurable_and_a_bad_entry_is_named():
    rates = rates_from('{"tcp": [3, 12.5]}')
    assert rates["tcp"] == (3.0, 12.5) and rates["cma"] == DEFAULT_RATES_GBPS["cma"]
    assert ABOVE_LINE_RATE in judge(["tcp/eth0"], "inter-node", "DRAM", MIB, 20.0, rates).flags
    with pytest.raises(ValueError, match="'tcp'"):
        rates_from('{"tcp": 3}')
