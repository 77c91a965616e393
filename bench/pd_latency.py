"""TTFT and whole-request time through kvscope's P/D pair over vLLM's stock NixlConnector pair.

Same tiny model, prompts and proxy for every pair. The stock pair is pinned one core per
server (unpinned it takes tens of seconds per request, PLATFORM.md); ours runs pinned and
unpinned. Also the idle CPU of each pair in % of one core, over consecutive 10 s windows from
the end of the last request, and that of a plain pair (two servers without any connector, each
request prefilled on one and then run whole on the other): vLLM's own idle cost, the floor no
connector can go under; its decode-side times are those of one server alone.
"""

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvscope.bench.pd_pair import PDPair, ProxyThread, pid_cpu_seconds
from kvscope.bench.results import record
from kvscope.demo.prompts import long_prompt


@dataclass
class PairFigures:
    """What one P/D pair measured; `error` says why a pair has no figures."""

    name: str
    ttft_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    idle_cpu_pct: list[float] = field(default_factory=list)  # one per window
    start_s: float = float("nan")
    error: str = ""

    @property
    def idle_median(self) -> float:
        return statistics.median(self.idle_cpu_pct) if self.idle_cpu_pct else float("nan")


def timed_stream(url: str, body: dict, timeout_s: float) -> tuple[float, float]:
    """(time to first token, whole-request time) of one streamed completion."""
    start = time.perf_counter()
    first = None
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True},
                      timeout=timeout_s) as answer:  # fmt: skip
        answer.raise_for_status()
        for line in answer.iter_lines():
            if first is None and line.startswith("data: ") and '"text"' in line:
                first = time.perf_counter() - start
    return first if first is not None else float("nan"), time.perf_counter() - start


def idle_cpu_percent(pair: PDPair, seconds: float) -> float:
    """CPU of both servers' process trees while idle, in % of one core."""
    pids = [server.process.pid for server in pair.servers]
    before = sum(pid_cpu_seconds(pid) for pid in pids)
    time.sleep(seconds)
    return (sum(pid_cpu_seconds(pid) for pid in pids) - before) / seconds * 100


def measure(name: str, pair: PDPair, args: argparse.Namespace) -> PairFigures:
    figures = PairFigures(name)
    print(f"[{name}] starting two servers (timeout {args.start_timeout:.0f} s)...", flush=True)
    start = time.perf_counter()
    try:
        pair.start(args.start_timeout)
        figures.start_s = time.perf_counter() - start
        if pair.plain:  # no connector: both servers do their share, timed on decode alone
            _requests(name, pair, pair.decode.url, args, figures, prefill_first=pair.prefill.url)
        else:
            proxy = ProxyThread(pair.prefill.url, pair.decode.url)
            try:
                _requests(name, pair, proxy.url, args, figures)
            finally:
                proxy.stop()
        for window in range(args.idle_windows):
            idle = idle_cpu_percent(pair, args.idle_s)
            figures.idle_cpu_pct.append(idle)
            print(f"[{name}] idle CPU, window {window + 1} of {args.idle_windows}"
                  f" ({args.idle_s:.0f} s): {idle:.1f} %", flush=True)  # fmt: skip
    except Exception as exc:
        figures.error = f"{type(exc).__name__}: {exc}"[:300]
        print(f"[{name}] failed: {figures.error} (logs in {pair.workdir})", flush=True)
    finally:
        pair.stop()
    return figures


def _requests(
    name: str, pair: PDPair, url: str, args, figures: PairFigures, prefill_first: str = ""
) -> None:
    """Timed streamed requests to `url`; `prefill_first`: an untimed 1-token request to that
    server first, so that a plain pair's two servers both work as a P/D pair's do."""
    for i in range(args.requests + 1):  # the first one warms up (handshake, connection)
        prompt = f"Request {i} of {name}: " + long_prompt(i, sentences=4)
        body = {"model": str(pair.model), "prompt": prompt, "max_tokens": args.max_tokens,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        if prefill_first:
            timed_stream(prefill_first, {**body, "max_tokens": 1}, args.request_timeout)
        ttft, total = timed_stream(url, body, args.request_timeout)
        print(f"[{name}] request {i}: TTFT {ttft:.3f} s, total {total:.3f} s", flush=True)
        if i:
            figures.ttft_s.append(ttft)
            figures.total_s.append(total)


def report(results: list[PairFigures]) -> None:
    print(f"\n{'pair':<22}{'start s':>9}{'TTFT s':>9}{'total s':>9}{'idle CPU %':>12}"
          f"{'(windows)':>22}  note")  # fmt: skip
    for r in results:
        ttft = statistics.median(r.ttft_s) if r.ttft_s else float("nan")
        total = statistics.median(r.total_s) if r.total_s else float("nan")
        windows = " ".join(f"{w:.1f}" for w in r.idle_cpu_pct)
        print(f"{r.name:<22}{r.start_s:>9.1f}{ttft:>9.3f}{total:>9.3f}{r.idle_median:>12.1f}"
              f"{windows:>22}  {r.error}")  # fmt: skip
        if r.idle_cpu_pct:
            kind = r.name.split()[0] + ("" if r.name.endswith("unpinned") else "_pinned")
            target = "< 5" if kind == "ours" else ""
            note = f"{r.name}, median of the windows {windows}"
            record("pd_latency", f"idle_cpu_{kind}_pct", r.idle_median, "% of a core", target, note)
    by_name = {r.name: r for r in results}
    _report_floor(by_name)
    stock = by_name.get("stock pinned")
    for ours in ("ours unpinned", "ours pinned"):
        mine = by_name.get(ours)
        if stock and mine and stock.ttft_s and mine.ttft_s:
            ttft, total = _ratio(mine.ttft_s, stock.ttft_s), _ratio(mine.total_s, stock.total_s)
            print(f"{ours} / stock pinned: TTFT {ttft:.2f}, total {total:.2f} (target <= 0.5)")
            suffix = "" if ours == "ours unpinned" else "_pinned"
            record("pd_latency", f"ttft{suffix}_over_stock", ttft, "ratio", "<= 0.5", note=ours)
            record("pd_latency", f"total{suffix}_over_stock", total, "ratio", "<= 0.5", note=ours)
        elif mine:
            print(f"{ours} / stock pinned: no ratio, the stock pair has no figures"
                  f" ({stock.error if stock else 'not run'})")  # fmt: skip


def _report_floor(by_name: dict[str, PairFigures]) -> None:
    """Our idle CPU against vLLM's own (the plain pair), as a difference and a ratio."""
    plain = by_name.get("plain unpinned")
    mine = by_name.get("ours unpinned")
    if not (plain and mine and plain.idle_cpu_pct and mine.idle_cpu_pct):
        return
    above = mine.idle_median - plain.idle_median
    ratio = mine.idle_median / plain.idle_median if plain.idle_median else float("nan")
    print(f"idle CPU, ours unpinned - plain vLLM pair: {above:+.1f} points; ours / plain: "
          f"{ratio:.2f} (plain vLLM's floor: {plain.idle_median:.1f} %)")  # fmt: skip
    record("pd_latency", "idle_cpu_ours_minus_plain_pct", above, "% of a core")
    record("pd_latency", "idle_cpu_ours_over_plain", ratio, "ratio")
    if plain.ttft_s and mine.ttft_s:  # the plain pair's timed requests ran on one server alone
        ttft = _ratio(mine.ttft_s, plain.ttft_s)
        print(f"ours unpinned / one server alone: TTFT {ttft:.2f} (target <= 1.5)")
        record("pd_latency", "ttft_over_single", ttft, "ratio", "<= 1.5")


def _ratio(mine: list[float], theirs: list[float]) -> float:
    return statistics.median(mine) / statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model dir (default: build the tiny model)")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--idle-windows", type=int, default=3, help="consecutive idle windows")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--pairs", default="plain unpinned,ours unpinned,ours pinned,stock pinned")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvscope-pd-bench-"))
    model = args.model
    if model is None:
        from kvscope.model.build import build_model

        model = build_model(workdir / "tiny")
    pairs = {
        "plain unpinned": lambda: PDPair(model, workdir / "plain-unpinned", plain=True),
        "ours unpinned": lambda: PDPair(model, workdir / "ours-unpinned"),
        "ours pinned": lambda: PDPair(model, workdir / "ours-pinned", cores=(0, 1)),
        "stock pinned": lambda: PDPair(model, workdir / "stock-pinned", stock=True, cores=(0, 1)),
    }
    names = [n.strip() for n in args.pairs.split(",")]
    report([measure(name, pairs[name](), args) for name in names])


if __name__ == "__main__":
    main()
