"""P2P READ bandwidth over raw NIXL, the reader's and the owner's share of a gap, and idle CPU."""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from dataclasses import dataclass, field

os.environ.setdefault("UCX_NET_DEVICES", "lo")


from kvscope.bench.common.paired_engines import balanced_orders  # noqa: E402
from kvscope.bench.common.results import record  # noqa: E402
from kvscope.bench.common.spread import median_ratio_interval  # noqa: E402
from kvscope.connector.p2p.transport.layout import KVLayout, check_compatible  # noqa: E402
from kvscope.connector.p2p.transport.nixl_agent import load_nixl_api  # noqa: E402
from kvscope.connector.p2p.transport.nixl_transport import NixlTransport  # noqa: E402
from kvscope.connector.p2p.transport.side_channel import PeerInfo, fetch_peer_info  # noqa: E402
from kvscope.harness.nixl_peer import (  # noqa: E402
    RAW_POLL_1MS,
    RAW_PROGRESS_THREAD,
    FakeKVShape,
    PeerProcess,
    make_fake_kv_caches,
)

GIB = 1024**3

READ_TARGET = 0.95
"""kvscope's READ bandwidth over raw NIXL's, against each raw owner."""


def _scattered_block_ids(num_blocks: int, count: int) -> tuple[list[int], list[int]]:
    """Every other block from the owner into a shuffled set of local blocks: real scatter."""
    remote_ids = list(range(0, num_blocks, 2))[:count]
    local_ids = list(reversed(range(num_blocks)))[:count]
    return remote_ids, local_ids


class TransportSession:
    """Both sides kvscope: a stand-in owner process and a NixlTransport reader here."""

    def __init__(self, shape: FakeKVShape, read_blocks: int) -> None:
        print("  starting a kvscope owner process ...", flush=True)
        self.owner = PeerProcess("bench-owner", shape, seed=None)
        self.reader = NixlTransport("bench-reader", make_fake_kv_caches(shape, seed=None))
        info = fetch_peer_info("127.0.0.1", self.owner.port)
        self.peer = self.reader.add_peer(info.agent_metadata, info.layout)
        self.remote_ids, self.local_ids = _scattered_block_ids(shape.num_blocks, read_blocks)
        self.nbytes = 0
        self.reads = 0
        self.read_rounds(2)  # warm-up: pays the connection set-up

    def read_rounds(self, rounds: int, owner: PeerProcess | None = None) -> list[float]:
        """Timed reads from this session's owner, or from `owner` (a raw one: the cross arm);
        before each, the owner is told to expect it, as the connector's lender is (an owner
        polls its agent only while reads are due; a raw owner ignores it)."""
        owner = owner or self.owner
        peer = self.peer if owner is self.owner else self._cross_peer(owner)
        seconds = []
        try:
            for _ in range(rounds):
                self.reads += 1
                notif = f"bench-read-{self.reads}"
                owner.request({"cmd": "expect", "msg": notif, "timeout_s": 60})
                started = time.perf_counter()
                xfer_id = self.reader.read_blocks(
                    peer, self.remote_ids, self.local_ids, notif.encode()
                )
                (result,) = self.reader.wait([xfer_id], timeout_s=30)
                seconds.append(time.perf_counter() - started)
                if not result.ok:
                    raise RuntimeError(f"kvscope read failed: {result.cause}")
                self.nbytes = result.nbytes
        finally:
            if peer != self.peer:
                self.reader.remove_peer(peer)
        return seconds

    def _cross_peer(self, owner: PeerProcess) -> str:
        """This reader connected to another owner, its connection set-up paid untimed."""
        info = fetch_peer_info("127.0.0.1", owner.port)
        peer = self.reader.add_peer(info.agent_metadata, info.layout)
        for _ in range(2):
            xfer_id = self.reader.read_blocks(peer, self.remote_ids, self.local_ids, b"warm-up")
            self.reader.wait([xfer_id], timeout_s=30)
        return peer

    def idle_cpu(self, idle_s: float) -> tuple[float, float]:
        """Share of one core the reader and the owner use with nothing to do."""
        print(f"  letting both sides go idle, then measuring CPU for {idle_s} s ...", flush=True)
        time.sleep(self.reader.config.hot_after_activity_s + 0.3)
        cpu_reader, cpu_owner = time.process_time(), self.owner.cpu_seconds()
        time.sleep(idle_s)
        idle_reader = (time.process_time() - cpu_reader) / idle_s
        return idle_reader, (self.owner.cpu_seconds() - cpu_owner) / idle_s

    def owner_cpu_while_expecting_a_read(self, seconds: float = 1.0) -> float:
        """Share of one core the owner's poller uses while it polls fast (a read is due)."""
        self.owner.request({"cmd": "expect", "msg": "due", "timeout_s": seconds + 1})
        cpu_owner = self.owner.cpu_seconds()
        time.sleep(seconds)
        return (self.owner.cpu_seconds() - cpu_owner) / seconds

    def close(self) -> None:
        self.reader.close()
        self.owner.stop()


def measure_raw(
    shape: FakeKVShape,
    read_blocks: int,
    rounds: int,
    mode: str,
    idle_s: float = 0.0,
    ours: TransportSession | None = None,
    ours_first: bool = False,
) -> tuple[list[float], float, list[float]]:
    """Plain nixl_agent calls: an owner progressed as `mode` says, a reader that spin-polls;
    with `ours`, kvscope's reader also reads from that raw owner (before the raw reader when
    `ours_first`): the cross arm, which tells the reader's share from the owner's.

    Returns the raw reader's timed rounds, the owner's CPU share while idle (measured if
    idle_s > 0) and the cross arm's rounds (empty without `ours`).
    """
    print(f"  starting a raw NIXL owner process ({mode}) ...", flush=True)
    owner = PeerProcess("bench-raw-owner", shape, seed=None, raw=mode)
    cross: list[float] = []
    try:
        info = fetch_peer_info("127.0.0.1", owner.port)
        cpu_owner = owner.cpu_seconds()
        time.sleep(idle_s)
        idle_owner = (owner.cpu_seconds() - cpu_owner) / idle_s if idle_s else 0.0
        if ours is not None and ours_first:
            cross = ours.read_rounds(rounds, owner)
        seconds = _raw_reads(shape, info, read_blocks, rounds)
        if ours is not None and not ours_first:
            cross = ours.read_rounds(rounds, owner)
    finally:
        owner.stop()
    return seconds, idle_owner, cross


def _raw_reads(shape: FakeKVShape, info: PeerInfo, read_blocks: int, rounds: int) -> tuple:
    kv_caches = make_fake_kv_caches(shape, seed=None)
    layout = KVLayout.from_layer_tensors("raw-reader", kv_caches)
    api = load_nixl_api()
    config = api.nixl_agent_config(enable_prog_thread=False, backends=["UCX"])
    agent = api.nixl_agent(f"raw-reader-{os.getpid()}-{uuid.uuid4().hex[:8]}", config)
    regions = agent.register_memory(
        [(a, n, 0, "") for a, n in layout.registration_regions()], "DRAM"
    )
    mapping = check_compatible(layout, info.layout)
    local = agent.prep_xfer_dlist(
        "NIXL_INIT_AGENT", layout.descriptor_array(mapping.per_block), "DRAM"
    )
    peer = agent.add_remote_agent(info.agent_metadata)
    remote = agent.prep_xfer_dlist(peer, info.layout.descriptor_array(mapping.per_block), "DRAM")
    remote_ids, local_ids = _scattered_block_ids(shape.num_blocks, read_blocks)
    local_idx, remote_idx = mapping.descriptor_ids(local_ids, remote_ids)
    seconds = []
    for _ in range(rounds + 2):  # the first two pay the connection set-up
        started = time.perf_counter()
        handle = agent.make_prepped_xfer("READ", local, local_idx, remote, remote_idx, b"bench")
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        seconds.append(time.perf_counter() - started)
        handle.release()
        if state != "DONE":
            raise RuntimeError(f"raw NIXL read ended in state {state}")
    for dlist in (local, remote):
        agent.release_dlist_handle(dlist)
    agent.remove_remote_agent(peer)
    agent.deregister_memory(regions)
    return seconds[2:]


def _summary(seconds: list[float], nbytes: int) -> str:
    median, slowest, fastest = (
        nbytes / s / GIB for s in (statistics.median(seconds), max(seconds), min(seconds))
    )
    return f"{median:6.2f} GiB/s (range {slowest:.2f}-{fastest:.2f})"


RAW_LABELS = {
    RAW_PROGRESS_THREAD: "raw NIXL, owner as shipped (progress thread)",
    RAW_POLL_1MS: "raw NIXL, owner polled by hand every 1 ms",
}


def _bandwidth_ratio(mine_s: list[float], theirs_s: list[float]) -> tuple[float, str]:
    """My bandwidth over theirs (the inverse of the median times), and its 90% interval."""
    low, high = median_ratio_interval(theirs_s, mine_s)
    ratio = statistics.median(theirs_s) / statistics.median(mine_s)
    return ratio, f"90% bootstrap interval {low:.3f}-{high:.3f}"


def _print_bandwidth(arms: Arms, nbytes: int) -> None:
    print(f"\nREAD of {nbytes / 2**20:.0f} MiB, median of {len(arms.ours)} rounds each:")
    for mode, label in RAW_LABELS.items():
        print(f"  {label:<46}{_summary(arms.raw[mode], nbytes)}")
    print(f"  {'kvscope NixlTransport (adaptive pollers)':<46}{_summary(arms.ours, nbytes)}")
    print(f"  {'kvscope reader, raw owner as shipped':<46}{_summary(arms.cross, nbytes)}")
    for mode, label in RAW_LABELS.items():
        ratio, interval = _bandwidth_ratio(arms.ours, arms.raw[mode])
        verdict = "meets" if ratio >= READ_TARGET else "BELOW"
        print(f"  kvscope / ({label}): {ratio:.3f}, {interval} ({verdict} the target)")
        metric = "read_over_raw_" + mode.replace("-", "_")  # progress_thread, poll_1ms
        note = f"{label}; {len(arms.ours)} rounds, {interval}"
        record("nixl_bandwidth", metric, ratio, "ratio", f">= {READ_TARGET}", note=note)
    print("  where the gap is, against the raw owner as shipped:")
    for metric, mine, theirs, text in (
        (
            "read_kvscope_reader_over_raw_reader",
            arms.cross,
            arms.raw[RAW_PROGRESS_THREAD],
            "kvscope's reader over the raw reader (one raw owner)",
        ),
        (
            "read_kvscope_owner_over_raw_owner",
            arms.ours,
            arms.cross,
            "kvscope's owner over the raw owner (kvscope's reader)",
        ),
    ):
        ratio, interval = _bandwidth_ratio(mine, theirs)
        print(f"    {text}: {ratio:.3f}, {interval}")
        record("nixl_bandwidth", metric, ratio, "ratio", note=f"{text}; {interval}")


@dataclass
class Arms:
    """Each arm's timed READs, seconds: kvscope's pair; the raw reader against each raw owner;
    kvscope's reader against the raw owner as shipped (the cross arm)."""

    ours: list[float] = field(default_factory=list)
    raw: dict[str, list[float]] = field(default_factory=lambda: {m: [] for m in RAW_LABELS})
    cross: list[float] = field(default_factory=list)
    shipped_idle: float = 0.0  # CPU of a raw owner as shipped, measured once


def measure_arms(ours: TransportSession, shape: FakeKVShape, args: argparse.Namespace) -> Arms:
    """args.trials trials of args.rounds READs an arm. The three owners' groups take every
    place, and follow each other, equally often (balanced_orders), so drifting load on the
    machine hits all alike; a raw owner runs only while its group does (as shipped it spins
    a core, which would slow the others)."""
    arms, orders = Arms(), balanced_orders(3)
    for trial in range(args.trials):
        for group in orders[trial % len(orders)]:
            if group == 0:
                arms.ours += ours.read_rounds(args.rounds)
                continue
            mode = (RAW_PROGRESS_THREAD, RAW_POLL_1MS)[group - 1]
            shipped = mode == RAW_PROGRESS_THREAD
            seconds, idle, cross = measure_raw(
                shape,
                args.read_blocks,
                args.rounds,
                mode,
                idle_s=1.0 if shipped and trial == 0 else 0.0,
                ours=ours if shipped else None,
                ours_first=trial % 2 == 1,
            )
            arms.raw[mode] += seconds
            arms.cross += cross
            arms.shipped_idle = max(arms.shipped_idle, idle)
    return arms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--blocks", type=int, default=256, help="blocks in each side's KV cache")
    parser.add_argument("--read-blocks", type=int, default=96, help="blocks per READ")
    parser.add_argument("--rounds", type=int, default=5, help="READs an arm a trial")
    parser.add_argument("--trials", type=int, default=6, help="the arms' groups in turn")
    parser.add_argument("--idle-s", type=float, default=2.0)
    args = parser.parse_args()
    # A mid-sized model's block: 8 KV heads x 32 tokens x head_dim 128, bf16 (128 KiB per layer).
    shape = FakeKVShape(args.layers, args.blocks, num_kv_heads=8, block_size=32, head_dim=128)
    block_kib = 8 * 32 * 2 * 128 * 2 // 1024
    print(
        f"P2P READ, {args.layers} layers x {args.blocks} blocks x {block_kib} KiB per block and"
        f" layer per side; each READ moves {args.read_blocks} scattered blocks of every layer"
        f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    ours = TransportSession(shape, args.read_blocks)
    try:
        arms = measure_arms(ours, shape, args)
        idle_reader, idle_owner = ours.idle_cpu(args.idle_s)
        hot_owner = ours.owner_cpu_while_expecting_a_read()
    finally:
        ours.close()
    _print_bandwidth(arms, ours.nbytes)
    print(f"\nCPU, % of one core, with no transfers ({args.idle_s} s):")
    print(f"  kvscope reader (agent + poller):                 {idle_reader:6.1%}")
    print(f"  kvscope owner (agent + poller + side channel):   {idle_owner:6.1%}")
    print(f"  raw NIXL owner as shipped (progress thread, 1 s): {arms.shipped_idle:6.1%}")
    print(f"  kvscope owner while a read is due (1-10 ms polls): {hot_owner:6.1%}")
    for who, share in (
        ("reader", idle_reader),
        ("owner", idle_owner),
        ("raw_owner_progress_thread", arms.shipped_idle),
    ):
        record("nixl_bandwidth", f"idle_cpu_{who}_pct", share * 100, "% of a core")


if __name__ == "__main__":
    main()
