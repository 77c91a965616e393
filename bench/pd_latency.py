"""TTFT and whole-request time through kvscope's P/D pair over vLLM's stock NixlConnector pair.

Same tiny model, prompts and proxy for every pair. The stock pair is pinned one core per
server (unpinned it takes tens of seconds per request, PLATFORM.md) and runs as vLLM does by
default; a second stock pair ("uniproc") gets the setting kvscope's servers use, the model in
the engine-core process (demo/engine.py ENGINE_ENV), to show what that setting alone gives.
Ours runs pinned and unpinned. Also the idle CPU of each pair in % of one core, over
consecutive 10 s windows from the end of the last request, and that of a plain pair (two
servers without any connector, each request prefilled on one and then run whole on the
other): vLLM's own idle cost, the floor no connector can go under; its decode-side times are
those of one server alone.

Times are medians with their spread (IQR, range) over --requests timed requests, sent through
one kept-alive HTTP client (a new client per request spent 45-110 ms, more under load, building
its TLS context inside the timed region); ratios come with a 90 % bootstrap interval, and each
pair's load average is shown: the pairs run one after another on a shared machine, so the load
may differ between them. --phases breaks our pairs' requests down by their spans (pd_phases).
"""

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kvscope.bench.pd_pair import PDPair, ProxyThread, pid_cpu_seconds
from kvscope.bench.pd_phases import TimedRequest, report_phases
from kvscope.bench.results import record
from kvscope.bench.spread import Spread, median_ratio_interval
from kvscope.demo.prompts import long_prompt


@dataclass
class PairFigures:
    """What one P/D pair measured; `error` says why a pair has no figures."""

    name: str
    ttft_s: list[float] = field(default_factory=list)
    total_s: list[float] = field(default_factory=list)
    idle_cpu_pct: list[float] = field(default_factory=list)  # one per window
    load_avg: list[float] = field(default_factory=list)  # 1-min load before and after requests
    timed: list[TimedRequest] = field(default_factory=list)  # for the phase breakdown
    start_s: float = float("nan")
    error: str = ""

    @property
    def idle_median(self) -> float:
        return statistics.median(self.idle_cpu_pct) if self.idle_cpu_pct else float("nan")


def timed_stream(client: httpx.Client, url: str, body: dict) -> tuple[float, float]:
    """(time to first token, whole-request time) of one streamed completion."""
    start = time.perf_counter()
    first = None
    with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as answer:
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
        figures.load_avg.append(os.getloadavg()[0])
        with httpx.Client(timeout=args.request_timeout) as client:
            if pair.plain:  # no connector: both servers do their share, timed on decode alone
                prefill_url = pair.prefill.url
                _requests(name, pair, client, pair.decode.url, args, figures, prefill_url)
            else:
                proxy = ProxyThread(pair.prefill.url, pair.decode.url)
                try:
                    _requests(name, pair, client, proxy.url, args, figures)
                finally:
                    proxy.stop()
        figures.load_avg.append(os.getloadavg()[0])
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
    if pair.spans_to_files:  # after stop: the servers flushed their spans
        report_phases(figures.timed, pair.workdir, name)
    return figures


def _requests(
    name: str,
    pair: PDPair,
    client: httpx.Client,
    url: str,
    args: argparse.Namespace,
    figures: PairFigures,
    prefill_first: str = "",
) -> None:
    """Timed streamed requests to `url` after --warmup untimed ones (handshake, connections);
    `prefill_first`: an untimed 1-token request to that server first, so that a plain pair's
    two servers both work as a P/D pair's do."""
    for i in range(args.warmup + args.requests):
        prompt = f"Request {i} of {name}: " + long_prompt(i, sentences=4)
        body = {"model": str(pair.model), "prompt": prompt, "max_tokens": args.max_tokens,
                "temperature": 0, "ignore_eos": True}  # fmt: skip
        if prefill_first:
            timed_stream(client, prefill_first, {**body, "max_tokens": 1})
        sent = time.time()
        ttft, total = timed_stream(client, url, body)
        warm = " (warm-up, untimed)" if i < args.warmup else ""
        print(f"[{name}] request {i}: TTFT {ttft:.3f} s, total {total:.3f} s{warm}", flush=True)
        if i >= args.warmup:
            figures.timed.append(TimedRequest(sent, sent + ttft, sent + total))
            figures.ttft_s.append(ttft)
            figures.total_s.append(total)


def report(results: list[PairFigures]) -> None:
    print(f"\n{'pair':<22}{'start s':>9}{'TTFT s':>9}{'TTFT IQR':>15}{'total s':>9}"
          f"{'idle CPU %':>12}{'(windows)':>22}{'load':>11}  note")  # fmt: skip
    for r in results:
        ttft, total = Spread.of(r.ttft_s), Spread.of(r.total_s)
        windows = " ".join(f"{w:.1f}" for w in r.idle_cpu_pct)
        iqr = f"{ttft.q1:.3f}-{ttft.q3:.3f}"
        print(f"{r.name:<22}{r.start_s:>9.1f}{ttft.median:>9.3f}{iqr:>15}{total.median:>9.3f}"
              f"{r.idle_median:>12.1f}{windows:>22}{_load_text(r):>11}  {r.error}")  # fmt: skip
        if r.idle_cpu_pct:
            pinned = "" if r.name.endswith("unpinned") else "_pinned"
            kind = "_".join(r.name.split()[:-1]) + pinned
            target = "< 5" if kind == "ours" else ""
            note = f"{r.name}, median of the windows {windows}"
            record("pd_latency", f"idle_cpu_{kind}_pct", r.idle_median, "% of a core", target, note)
    for r in results:
        if r.ttft_s:
            print(f"{r.name}: TTFT {Spread.of(r.ttft_s).text(1000, ' ms')};"
                  f" total {Spread.of(r.total_s).text(1000, ' ms')}")  # fmt: skip
    by_name = {r.name: r for r in results}
    _report_floor(by_name)
    # vLLM's default stock pair carries the target; the one with kvscope's executor setting
    # shows what that setting alone gives.
    stocks = (("stock pinned", "", "<= 0.5"), ("stock uniproc pinned", "_uniproc", ""))
    for stock_name, metric_suffix, target in stocks:
        stock = by_name.get(stock_name)
        for ours in ("ours unpinned", "ours pinned"):
            mine = by_name.get(ours)
            if stock and mine and stock.ttft_s and mine.ttft_s:
                _report_ratios(ours, mine, stock_name, stock, metric_suffix, target)
            elif mine and (stock or stock_name == "stock pinned"):
                print(f"{ours} / {stock_name}: no ratio, the stock pair has no figures"
                      f" ({stock.error if stock else 'not run'})")  # fmt: skip


def _report_ratios(
    ours: str, mine: PairFigures, stock_name: str, stock: PairFigures, metric_suffix: str,
    target: str,
) -> None:  # fmt: skip
    """Ratios of medians, each with its 90 % bootstrap interval and both pairs' load."""
    suffix = "" if ours == "ours unpinned" else "_pinned"
    loads = f"load {_load_text(mine)} vs {_load_text(stock)}"
    parts = []
    for what, theirs_s, mine_s in (("ttft", stock.ttft_s, mine.ttft_s),
                                   ("total", stock.total_s, mine.total_s)):  # fmt: skip
        ratio = _ratio(mine_s, theirs_s)
        low, high = median_ratio_interval(mine_s, theirs_s)
        interval = f"90% interval {low:.2f}-{high:.2f}"
        parts.append(f"{what.upper() if what == 'ttft' else what} {ratio:.2f} ({interval})")
        note = f"{ours}; {interval}; n={len(mine_s)}/{len(theirs_s)}; {loads}"
        metric = f"{what}{suffix}_over_stock{metric_suffix}"
        record("pd_latency", metric, ratio, "ratio", target, note=note)
    print(f"{ours} / {stock_name}: {', '.join(parts)} (target {target or 'none'}; {loads})")


def _load_text(figures: PairFigures) -> str:
    return "-".join(f"{load:.1f}" for load in figures.load_avg)


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
        low, high = median_ratio_interval(mine.ttft_s, plain.ttft_s)
        print(
            f"ours unpinned / one server alone: TTFT {ttft:.2f} (90% interval {low:.2f}-"
            f"{high:.2f}; target <= 1.5; load {_load_text(mine)} vs {_load_text(plain)})"
        )
        note = f"90% interval {low:.2f}-{high:.2f}"
        record("pd_latency", "ttft_over_single", ttft, "ratio", "<= 1.5", note=note)


def _ratio(mine: list[float], theirs: list[float]) -> float:
    return Spread.of(mine).median / Spread.of(theirs).median


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model dir (default: build the tiny model)")
    parser.add_argument("--requests", type=int, default=15, help="timed requests per pair")
    parser.add_argument("--warmup", type=int, default=2, help="untimed requests first")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--idle-windows", type=int, default=3, help="consecutive idle windows")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument(
        "--pairs",
        default="plain unpinned,ours unpinned,ours pinned,stock pinned,stock uniproc pinned",
    )
    parser.add_argument("--phases", action="store_true", help="where our pairs' time went")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvscope-pd-bench-"))
    model = args.model
    if model is None:
        from kvscope.model.build import build_model

        model = build_model(workdir / "tiny")
    spans = args.phases
    pairs = {
        "plain unpinned": lambda: PDPair(model, workdir / "plain-unpinned", plain=True),
        "ours unpinned": lambda: PDPair(model, workdir / "ours-unpinned", spans_to_files=spans),
        "ours pinned": lambda: PDPair(
            model, workdir / "ours-pinned", cores=(0, 1), spans_to_files=spans
        ),  # fmt: skip
        "stock pinned": lambda: PDPair(model, workdir / "stock-pinned", stock=True, cores=(0, 1)),
        "stock uniproc pinned": lambda: PDPair(
            model, workdir / "stock-uniproc-pinned", stock=True, cores=(0, 1), stock_uniproc=True
        ),  # fmt: skip
    }
    names = [n.strip() for n in args.pairs.split(",")]
    report([measure(name, pairs[name](), args) for name in names])


if __name__ == "__main__":
    main()
