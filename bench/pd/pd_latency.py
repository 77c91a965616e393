"""TTFT and whole-request time through kvscope's P/D pair over vLLM's stock NixlConnector pair.

Same tiny model, prompts and proxy for every pair. The stock pair is pinned one core per
server (unpinned it takes tens of seconds per request, PLATFORM.md) and runs as vLLM does by
default; a second stock pair ("uniproc") gets the setting kvscope's servers use, the model in
the engine-core process (harness/engine.py ENGINE_ENV), to show what that setting alone gives.
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

--shape mid --prefix-tokens 1024,2048,4096: every pair runs --warmup then --requests requests at
each length (prompts of exactly that many tokens, each with its own first block); TTFT through
our pair over one server alone is recorded per length, and the other figures at 2k tokens.
"""

import argparse
import contextlib
import functools
import os
import tempfile
import time
from pathlib import Path

import httpx

from kvscope.bench.common.results import HEADLINE_TOKENS
from kvscope.bench.engine.offload_ttft import parse_lengths
from kvscope.bench.pd.pd_pair import PDPair, ProxyThread, pid_cpu_seconds
from kvscope.bench.pd.pd_phases import TimedRequest, report_phases
from kvscope.bench.pd.pd_report import PairFigures, report
from kvscope.harness.prompts import long_prompt

ROOM_TOKENS = 512
"""max_model_len above the longest prompt: the output and the request's head."""


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


def measure(group: list[tuple[str, PDPair]], args: argparse.Namespace) -> list[PairFigures]:
    """Starts the pairs of a group together and alternates their requests (one at a time, in
    turn, the order reversed every other request): pairs in one group see the same load."""
    figures = [PairFigures(name, headline(args.prefix_tokens)) for name, _ in group]
    names = " + ".join(name for name, _ in group)
    try:
        for (name, pair), mine in zip(group, figures, strict=True):
            print(
                f"[{name}] starting two servers (timeout {args.start_timeout:.0f} s)...", flush=True
            )
            start = time.perf_counter()
            pair.start(args.start_timeout)
            mine.start_s = time.perf_counter() - start
        for mine in figures:
            mine.load_avg.append(os.getloadavg()[0])
        with httpx.Client(timeout=args.request_timeout) as client, contextlib.ExitStack() as stack:
            targets = [_target(pair, stack) for _, pair in group]
            _requests(client, list(zip(group, targets, figures, strict=True)), args)
        for (name, pair), mine in zip(group, figures, strict=True):
            mine.load_avg.append(os.getloadavg()[0])
            _idle_windows(name, pair, mine, args)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
        for mine in figures:
            mine.error = mine.error or error
        print(f"[{names}] failed: {error} (logs in {group[0][1].workdir.parent})", flush=True)
    finally:
        for _, pair in group:
            pair.stop()
    for (name, pair), mine in zip(group, figures, strict=True):
        if pair.spans_to_files:  # after stop: the servers flushed their spans
            for tokens, samples in mine.by_tokens.items():
                label = f"{name}, {tokens} tokens" if tokens else name
                report_phases(samples.timed, pair.workdir, label)
    return figures


def _target(pair: PDPair, stack: contextlib.ExitStack) -> tuple[str, str]:
    """(URL the timed request goes to, URL of an untimed 1-token request first, or "").

    A plain pair (no connector) does both servers' share, timed on the decode server alone;
    a P/D pair gets its proxy, stopped when the stack closes."""
    if pair.plain:
        return pair.decode.url, pair.prefill.url
    proxy = ProxyThread(pair.prefill.url, pair.decode.url)
    stack.callback(proxy.stop)
    return proxy.url, ""


def _idle_windows(name: str, pair: PDPair, figures: PairFigures, args) -> None:
    for window in range(args.idle_windows):
        idle = idle_cpu_percent(pair, args.idle_s)
        figures.idle_cpu_pct.append(idle)
        print(
            f"[{name}] idle CPU, window {window + 1} of {args.idle_windows}"
            f" ({args.idle_s:.0f} s): {idle:.1f} %",
            flush=True,
        )


def headline(lengths: list[int]) -> int:
    """The prompt length the pair-against-pair figures use: 2k if asked for, else the first."""
    return HEADLINE_TOKENS if HEADLINE_TOKENS in lengths else (lengths or [0])[0]


def _requests(client: httpx.Client, runs: list, args: argparse.Namespace) -> None:
    """Timed streamed requests after --warmup untimed ones (handshake, connections, kernels at
    that length), at each prompt length, to each pair in turn; `runs`: ((name, pair), (url,
    prefill_first), figures) per pair."""
    for tokens in args.prefix_tokens or [0]:
        for i in range(args.warmup + args.requests):
            for (name, pair), (url, prefill_first), figures in runs[:: 1 if i % 2 == 0 else -1]:
                body = {
                    "model": str(pair.model),
                    "prompt": _prompt(pair.model, name, i, tokens),
                    "max_tokens": args.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                }
                if prefill_first:  # a plain pair's prefill server works as a P/D pair's does
                    timed_stream(client, prefill_first, {**body, "max_tokens": 1})
                sent = time.time()
                ttft, total = timed_stream(client, url, body)
                warm = " (warm-up, untimed)" if i < args.warmup else ""
                at = f" at {tokens} tokens" if tokens else ""
                print(
                    f"[{name}] request {i}{at}: TTFT {ttft:.3f} s, total {total:.3f} s{warm}",
                    flush=True,
                )
                if i >= args.warmup:
                    samples = figures.samples(tokens)
                    samples.timed.append(TimedRequest(sent, sent + ttft, sent + total))
                    samples.ttft_s.append(ttft)
                    samples.total_s.append(total)


def _prompt(model: Path, name: str, i: int, tokens: int) -> str | list[int]:
    """The short text prompt, or `tokens` token ids; either way its first block is its own."""
    head = f"Request {i} of {name}: "
    if not tokens:
        return head + long_prompt(i, sentences=4)
    from kvscope.model.prompts import token_prompt

    return token_prompt(model, tokens, seed=i, head=head)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="tiny", help="model shape (model/shapes.py)")
    parser.add_argument("--model", type=Path, help="model dir (default: the shape's, built)")
    parser.add_argument(
        "--prefix-tokens",
        type=parse_lengths,
        default=[],
        help="prompt lengths in tokens, comma-separated (default: short)",
    )
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
    parser.add_argument(
        "--together",
        default="plain unpinned,ours unpinned",
        help="pairs started together, their requests alternating",
    )
    parser.add_argument("--phases", action="store_true", help="where our pairs' time went")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvscope-pd-bench-"))
    from kvscope.model.build import ensure_model

    model = args.model or ensure_model(args.shape)
    spans = args.phases
    length = max(args.prefix_tokens) + ROOM_TOKENS if args.prefix_tokens else None
    pair_of = functools.partial(PDPair, max_model_len=length)
    pairs = {
        "plain unpinned": lambda: pair_of(model, workdir / "plain-unpinned", plain=True),
        "ours unpinned": lambda: pair_of(model, workdir / "ours-unpinned", spans_to_files=spans),
        "ours pinned": lambda: pair_of(
            model, workdir / "ours-pinned", cores=(0, 1), spans_to_files=spans
        ),
        "stock pinned": lambda: pair_of(model, workdir / "stock-pinned", stock=True, cores=(0, 1)),
        "stock uniproc pinned": lambda: pair_of(
            model, workdir / "stock-uniproc-pinned", stock=True, cores=(0, 1), stock_uniproc=True
        ),
    }
    names = [n.strip() for n in args.pairs.split(",")]
    together = [n for n in (n.strip() for n in args.together.split(",")) if n in names]
    groups = [together] if len(together) > 1 else []
    groups += [[name] for name in names if name not in together or len(together) < 2]
    results = [f for group in groups for f in measure([(n, pairs[n]()) for n in group], args)]
    report(sorted(results, key=lambda f: names.index(f.name)), args.shape)


if __name__ == "__main__":
    main()
