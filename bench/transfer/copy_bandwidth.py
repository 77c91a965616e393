"""Copy engine store/load bandwidth next to a raw torch copy of the same bytes, in one run."""

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from kvscope.bench.common.results import record
from kvscope.bench.common.spread import median_interval
from kvscope.connector.cpu_offload.copy.engine import CopyEngine
from kvscope.connector.cpu_offload.copy.factory import make_copy_engine
from kvscope.connector.cpu_offload.copy.host_buffer import BlockLayout, HostBuffer

TARGET_RATIO = 0.95
LOWEST_LOW = 0.92
"""The lowest the 90% interval's lower end may be for a figure to meet its target."""


@dataclass(frozen=True)
class BenchConfig:
    """One transfer of num_blocks whole blocks, vLLM CPU layout [nb, heads, bs, 2*head_dim]."""

    mib: int = 64
    num_layers: int = 8
    num_kv_heads: int = 8
    block_size: int = 32
    head_dim: int = 128
    pattern: str = "scattered"  # device block ids: "contiguous" or "scattered" (shuffled)
    repeats: int = 31
    device: str = "cpu"
    threads: int = 1  # torch threads of the raw copy and of the CPU engine's worker

    @property
    def bytes_per_block(self) -> int:
        return self.num_layers * self.num_kv_heads * self.block_size * 2 * self.head_dim * 2

    @property
    def num_blocks(self) -> int:
        return max(1, self.mib * 2**20 // self.bytes_per_block)


@dataclass(frozen=True)
class Measurement:
    name: str
    seconds: list[float]  # one per timed round, in round order
    num_bytes: int

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def gib_per_s(self) -> float:
        return self.num_bytes / 2**30 / self.median_s


@dataclass(frozen=True)
class Ratio:
    """Engine over raw bandwidth: per round (the two copies ran back to back), and best-of."""

    per_round: list[float]

    @classmethod
    def of(cls, ours: Measurement, raw: Measurement) -> "Ratio":
        return cls([r / o for o, r in zip(ours.seconds, raw.seconds, strict=True)])

    @property
    def median(self) -> float:
        return statistics.median(self.per_round)

    def interval(self) -> tuple[float, float]:
        """The 90% bootstrap interval of the median of the rounds' (paired) ratios."""
        return median_interval(self.per_round)

    def interval_text(self) -> str:
        low, high = self.interval()
        return f"{low:.2f}-{high:.2f}"

    def verdict(self) -> str:
        """ok: the median at the target and the interval's lower end at LOWEST_LOW or above."""
        if self.median < TARGET_RATIO:
            return f"below {TARGET_RATIO}"
        return "ok" if self.interval()[0] >= LOWEST_LOW else f"low < {LOWEST_LOW}"


def best_of_ratio(ours: Measurement, raw: Measurement) -> float:
    """Fastest over fastest: what the machine gives each when neighbours leave it alone."""
    return min(raw.seconds) / min(ours.seconds)


@dataclass
class Setup:
    engine: CopyEngine
    device_block_ids: list[int]
    host_block_ids: list[int]
    raw_device_ranges: list[torch.Tensor]  # the first num_blocks blocks of each layer
    raw_host_ranges: list[torch.Tensor]  # each host layer: the same bytes, same pages


def build(config: BenchConfig) -> Setup:
    num_device_blocks = 2 * config.num_blocks
    shape = (config.num_layers, num_device_blocks, config.num_kv_heads, config.block_size)
    # Made on the device: a GiB of randn on one CPU thread takes longer than the whole bench.
    storage = torch.randn(*shape, 2 * config.head_dim, device=config.device, dtype=torch.bfloat16)
    kv_layers = list(storage.unbind(0))
    layout = BlockLayout.of(kv_layers, block_dim=0)
    host_buffer = HostBuffer(layout, config.num_blocks, pin_memory=config.device == "cuda")
    generator = torch.Generator().manual_seed(0)
    if config.pattern == "contiguous":
        device_block_ids = list(range(config.num_blocks))
    else:
        device_block_ids = torch.randperm(num_device_blocks, generator=generator)
        device_block_ids = device_block_ids[: config.num_blocks].tolist()
    return Setup(
        engine=make_copy_engine(kv_layers, host_buffer, block_dim=0, cpu_threads=config.threads),
        device_block_ids=device_block_ids,
        host_block_ids=list(range(config.num_blocks)),
        raw_device_ranges=[layer.narrow(0, 0, config.num_blocks) for layer in kv_layers],
        raw_host_ranges=host_buffer.layers,
    )


def timed(action: Callable[[], float | None], sync: Callable[[], None]) -> float:
    """Seconds the action took; an action that times itself returns its own figure."""
    sync()
    started = time.perf_counter()
    own_s = action()
    sync()
    return time.perf_counter() - started if own_s is None else own_s


def raw_copy(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """The baseline: plain copy_ of each layer's bytes as one contiguous range."""
    for target, source in zip(targets, sources, strict=True):
        target.copy_(source)


BUSY_STEP_S = 0.002
"""How long the busy caller runs Python between two polls: a short engine step's scheduling."""


def busy_caller_load_s(setup: Setup, num_blocks: int = 4, rounds: int = 15) -> float:
    """Median submit-to-result time of a small load while the caller runs Python between
    polls, as vLLM's engine thread does between forwards. The copy thread needs the GIL back
    after each torch call it makes, and a thread running Python hands it over only at its
    switch interval (5 ms) or its next blocking call (poll() yields once)."""
    engine, seconds = setup.engine, []
    for _ in range(rounds):
        started = time.perf_counter()
        job_id = engine.submit_load(
            setup.device_block_ids[:num_blocks], setup.host_block_ids[:num_blocks]
        )
        results = []
        while not results:
            step_end = time.perf_counter() + BUSY_STEP_S
            while time.perf_counter() < step_end:
                pass  # pure Python: the GIL stays with this thread
            results = engine.poll()
        assert [result.job_id for result in results] == [job_id] and results[0].ok
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


WORKER_WAIT_S = 600.0
"""A wait with a timeout leaves the job to the copy thread: the asynchronous path, measured
beside the one the ratio is taken on (a job waited for without one is copied by the waiter).
That path is timed from submit to the result being ready for poll() (CopyResult.finished_at):
the connector polls once a step and never sleeps on a copy, so the waiting thread's own wake-up
after the result (~140 us here) is the bench's, not the engine's."""


def measure(config: BenchConfig) -> list[Measurement]:
    setup = build(config)
    engine = setup.engine
    sync = torch.cuda.synchronize if config.device == "cuda" else lambda: None

    copy_only: dict[str, list[float]] = {"store": [], "load": []}

    def run_job(
        submit: Callable[[list[int], list[int]], int], timeout_s: float | None
    ) -> float | None:
        submitted = time.monotonic()  # CopyResult.finished_at's clock
        assert engine.wait(submit(setup.device_block_ids, setup.host_block_ids), timeout_s)
        [result] = engine.poll()
        assert result.ok, result.error
        if timeout_s is None:
            copy_only[result.direction.value].append(result.duration_s)
            return None
        return result.finished_at - submitted  # submit to ready for poll()

    actions = {
        "raw store": lambda: raw_copy(setup.raw_host_ranges, setup.raw_device_ranges),
        "engine store": lambda: run_job(engine.submit_store, None),
        "raw load": lambda: raw_copy(setup.raw_device_ranges, setup.raw_host_ranges),
        "engine load": lambda: run_job(engine.submit_load, None),
    }
    if config.device == "cpu":  # the CUDA engine has no copy thread: it queues on a stream
        actions["engine store on its thread"] = lambda: run_job(engine.submit_store, WORKER_WAIT_S)
        actions["engine load on its thread"] = lambda: run_job(engine.submit_load, WORKER_WAIT_S)
    samples: dict[str, list[float]] = {name: [] for name in actions}
    for _ in range(config.repeats + 1):  # the first round warms up and is dropped
        for name, action in actions.items():  # interleaved, so drift hits all alike
            samples[name].append(timed(action, sync))
    num_bytes = config.num_blocks * config.bytes_per_block
    if config.device == "cpu":  # the CUDA engine copies from the calling thread
        busy = busy_caller_load_s(setup)
        record(
            "copy_bandwidth",
            f"small_load_ms_busy_caller_{config.pattern}",
            busy * 1e3,
            "ms",
            "",
            f"4 blocks; the caller runs Python for {BUSY_STEP_S * 1e3:.0f} ms between polls",
        )
        print(f"{config.pattern}: a 4-block load with a busy caller took {busy * 1e3:.2f} ms")
    engine.shutdown()
    engine.host_buffer.close()
    # The engine's own copy time, without submit and hand-off: where any gap comes from.
    samples |= {f"copy only {direction}": s for direction, s in copy_only.items()}
    return [Measurement(n, s[1:], num_bytes) for n, s in samples.items()]


def print_table(config: BenchConfig, rows: list[tuple[str, list[Measurement]]]) -> None:
    print(
        f"copy engine vs raw torch copy: {config.num_blocks} blocks of "
        f"{config.bytes_per_block / 2**20:.2f} MiB ({config.num_layers} layers) per job, "
        f"{config.device}, {config.threads} torch thread(s), {config.repeats} rounds; ratio: "
        "median of the rounds' ratios with its 90% bootstrap interval, best: fastest over "
        "fastest; the engine's job waited for without a timeout is copied by the waiting "
        "thread, the copy thread rows hand it to the copy thread (the connector's path), "
        "timed from submit to the result ready for poll()"
    )
    print(
        f"{'pattern':<11} {'direction':<9} {'path':<11} {'engine GiB/s':>12} {'raw GiB/s':>10}"
        f" {'ratio':>6} {'(90%)':>10} {'best':>5}  {'verdict':<10} {'copy-only ratio':>15}"
    )
    for pattern, measurements in rows:
        by_name = {m.name: m for m in measurements}
        for direction in ("store", "load"):
            raw = by_name[f"raw {direction}"]
            copy_ratio = Ratio.of(by_name[f"copy only {direction}"], raw).median
            paths = [("waiter", by_name[f"engine {direction}"], "")]
            threaded = by_name.get(f"engine {direction} on its thread")
            if threaded:
                paths.append(("copy thread", threaded, "_copy_thread"))
            for path, engine, suffix in paths:
                ratio = Ratio.of(engine, raw)
                best = best_of_ratio(engine, raw)
                note = (
                    f"{engine.gib_per_s:.2f} vs {raw.gib_per_s:.2f} GiB/s, {config.device}, "
                    f"{config.mib} MiB per job, {config.repeats} rounds, 90% interval "
                    f"{ratio.interval_text()} (best-of {best:.2f}); the copy alone "
                    f"{copy_ratio:.2f}x raw"
                )
                if suffix:
                    note += (
                        "; the job handed to the copy thread (a wait with a timeout), timed "
                        "from submit to the result ready for poll()"
                    )
                record(
                    "copy_bandwidth",
                    f"{direction}_over_raw_{pattern}{suffix}",
                    ratio.median,
                    "ratio",
                    f">= {TARGET_RATIO}",
                    note,
                )
                print(
                    f"{pattern:<11} {direction:<9} {path:<11} {engine.gib_per_s:>12.2f}"
                    f" {raw.gib_per_s:>10.2f} {ratio.median:>6.2f} {ratio.interval_text():>10}"
                    f" {best:>5.2f}  {ratio.verdict():<10} {copy_ratio:>15.2f}"
                )


def parse_args(argv: list[str] | None = None) -> tuple[BenchConfig, list[str]]:
    defaults = BenchConfig()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=defaults.mib, help="bytes per job, MiB")
    parser.add_argument("--layers", type=int, default=defaults.num_layers)
    parser.add_argument("--kv-heads", type=int, default=defaults.num_kv_heads)
    parser.add_argument("--block-size", type=int, default=defaults.block_size, help="tokens")
    parser.add_argument("--head-dim", type=int, default=defaults.head_dim)
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--threads", type=int, default=defaults.threads)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--pattern",
        choices=["contiguous", "scattered", "both"],
        default="both",
        help="device block ids of a job: consecutive, shuffled, or one row of each",
    )
    args = parser.parse_args(argv)
    config = BenchConfig(
        mib=args.mib,
        num_layers=args.layers,
        num_kv_heads=args.kv_heads,
        block_size=args.block_size,
        head_dim=args.head_dim,
        repeats=args.repeats,
        device=args.device,
        threads=args.threads,
    )
    patterns = ["contiguous", "scattered"] if args.pattern == "both" else [args.pattern]
    return config, patterns


def main(argv: list[str] | None = None) -> None:
    config, patterns = parse_args(argv)
    torch.set_num_threads(config.threads)
    rows: list[tuple[str, list[Measurement]]] = []
    for pattern in patterns:
        print(f"measuring {pattern} ...", flush=True)
        rows.append((pattern, measure(replace(config, pattern=pattern))))
    print_table(config, rows)


if __name__ == "__main__":
    main()
