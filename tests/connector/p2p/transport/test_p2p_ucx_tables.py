"""UCX's protocol selection tables (UCX_PROTO_INFO=y, as UCX 1.19 prints them) parsed into the
lanes of each endpoint configuration, including a two-rail RDMA read this machine cannot run."""

from kvscope.connector.p2p.transport.ucx_tables import TableParser, is_active_message, is_read_into

LOG = """\
[1796657081.45] [vm:8585 :0]   +--------+-------------+-----------------------------------+
[1796657081.45] [vm:8585 :0]   | kvscope-decode-tp0-8585-0237a51 intra-node cfg#1         |
[1796657081.45] [vm:8585 :0]   | remote memory read by ucp_get*(multi) into host memory from host |
[1796657081.45] [vm:8585 :0]   +--------+-------------+-----------------------------------+
[1796657081.45] [vm:8585 :0]   | Range  | Description |              Config               |
[1796657081.45] [vm:8585 :0]   +--------+-------------+-----------------------------------+
[1796657081.45] [vm:8585 :0]   | 0..inf | zero-copy   | cma/memory                        |
[1796657081.45] [vm:8585 :0]   +--------+-------------+-----------------------------------+
[1796657081.46] [vm:8585 :0]   +------------+--------------------+---------------+
[1796657081.46] [vm:8585 :0]   | kvscope-decode-tp0-8585-0237a51 intra-node cfg#1 |
[1796657081.46] [vm:8585 :0]   | active message by ucp_am_send* from host memory |
[1796657081.46] [vm:8585 :0]   +------------+--------------------+---------------+
[1796657081.46] [vm:8585 :0]   |   Range    |    Description     |    Config     |
[1796657081.46] [vm:8585 :0]   +------------+--------------------+---------------+
[1796657081.46] [vm:8585 :0]   |          0 | short              | tcp/lo        |
[1796657081.46] [vm:8585 :0]   | 16516..inf | multi-frag copy-in | tcp/lo        |
[1796657081.46] [vm:8585 :0]   +------------+--------------------+---------------+
[1796657081.47] [vm:8585 :0] ucp_context.c:123 UCX  WARN  something UCX wanted to say
[1796657081.48] [gpu:77 :0]   +--------+-------------+----------------------------------------+
[1796657081.48] [gpu:77 :0]   | kvscope-decode-tp0-77-aa inter-node cfg#3             |
[1796657081.48] [gpu:77 :0]   | remote memory read by ucp_get* into cuda memory from cuda |
[1796657081.48] [gpu:77 :0]   +--------+-------------+----------------------------------------+
[1796657081.48] [gpu:77 :0]   | Range  | Description |              Config                    |
[1796657081.48] [gpu:77 :0]   +--------+-------------+----------------------------------------+
[1796657081.48] [gpu:77 :0]   | 0..8K  | zero-copy   | rc_mlx5/mlx5_0:1                       |
[1796] [gpu:77 :0] | 8K..inf| zero-copy | 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1 |
[1796657081.48] [gpu:77 :0]   +--------+-------------+----------------------------------------+
"""


def parsed() -> TableParser:
    parser = TableParser()
    for line in LOG.splitlines():
        parser.feed(line)
    parser.feed("")
    return parser


def test_each_table_names_its_worker_scope_operation_and_lanes():
    read, notif, gpu_read = parsed().tables
    assert (read.worker, read.scope, read.cfg) == (
        "kvscope-decode-tp0-8585-0237a51",
        "intra-node",
        1,
    )
    assert is_read_into(read, "host") and read.lanes == ("cma/memory",)
    assert is_active_message(notif) and notif.lanes == ("tcp/lo",)
    assert gpu_read.scope == "inter-node" and is_read_into(gpu_read, "cuda")
    assert gpu_read.lanes == ("rc_mlx5/mlx5_0:1", "rc_mlx5/mlx5_1:1")


def test_lines_outside_tables_are_kept_for_the_log():
    assert parsed().other == ["ucp_context.c:123 UCX  WARN  something UCX wanted to say"]
