"""`kvscope plan`: what-if sizing of each engine's host pool, from a running backend."""

import sys

import httpx


def add_parser(commands) -> None:
    plan = commands.add_parser(
        "plan",
        help="replay the host pool's traffic at other sizes and eviction policies: hit rate, "
        "predicted TTFT, the infinite-pool ceiling and the smallest size within 1%% of it",
    )
    plan.add_argument("--backend", default="http://127.0.0.1:4318", help="backend URL")
    plan.add_argument("--token", help="bearer token, if the backend wants one")
    plan.add_argument("--window", type=float, default=3600.0, help="seconds of spans to replay")
    plan.add_argument(
        "--sizes", help="multiples of today's pool, comma-separated (default 0.25,0.5,1,2,4,8)"
    )
    plan.set_defaults(handler=run_plan)


def run_plan(args) -> int:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    params = {"window": args.window, **({"sizes": args.sizes} if args.sizes else {})}
    try:
        response = httpx.get(
            f"{args.backend}/api/v1/plan", params=params, headers=headers, timeout=60
        )
        response.raise_for_status()
    except httpx.HTTPError as error:
        print(f"kvscope plan: cannot read {args.backend}/api/v1/plan: {error}", file=sys.stderr)
        print("Start a backend (kvscope backend) or pass --backend URL.", file=sys.stderr)
        return 2
    report = response.json()
    for engine_id in report["not_replayable"]:
        print(
            f"engine {engine_id}: its lookups did not record the blocks they asked "
            "(spans from before kvscope.block.looked_up); nothing to replay"
        )
    if not report["engines"]:
        print(f"No host pool lookups in the last {args.window:g} s.")
        return 1
    for engine in report["engines"]:
        print(format_engine(engine))
    return 0


def format_engine(engine: dict) -> str:
    """One engine's sizing: today, its ceiling, each policy's knee, a line per policy and size."""
    load, prefill = engine["load_tokens_per_s"], engine["prefill_tokens_per_s"]
    ceiling = engine["ceiling"]
    lines = [
        f"engine {engine['engine_id']}: pool {engine['pool_blocks']} blocks of "
        f"{engine['block_size']} tokens, {engine['lookups']} lookups asked "
        f"{engine['asked_tokens']} tokens, {engine['measured_hit_tokens']} hit today",
        f"  load {_rate(load)} tokens/s, prefill {_rate(prefill)} tokens/s; " + _today_ttft(engine),
        f"  ceiling (a pool that never evicts): {ceiling['pool_blocks']} blocks, "
        f"{ceiling['hit_tokens']} hit tokens ({ceiling['pool_hit_rate']:.1%}); "
        f"{ceiling['in_flight_lookups']} lookups found a block still being stored, a miss "
        f"({ceiling['in_flight_tokens']} tokens); today the pool recorded "
        f"{engine['recorded_in_flight_lookups']}",
        f"  the knee: the smallest pool within 1% of the ceiling, to a size step of "
        f"{engine['size_step_blocks']} blocks",
    ]
    for knee in engine["knees"]:
        lines.append(
            f"  knee {knee['policy']:<6} {knee['pool_blocks']:>7} blocks ({knee['factor']:.3g}x) "
            f"{knee['hit_tokens']:>10} hit tokens {knee['pool_hit_rate']:>6.1%}  TTFT "
            f"{_ms(knee['predicted_ttft_ms_p50'])} / {_ms(knee['predicted_ttft_ms_p95'])}"
        )
    lines.append(
        f"  {'policy':<6} {'size':>6} {'blocks':>7} {'hit tokens':>10} {'pool hit':>8} "
        f"{'saved s':>9} {'evicted':>7} {'in flight':>9} {'TTFT p50':>9} {'TTFT p95':>9}"
    )
    for row in engine["rows"]:
        saved = "n/a" if row["seconds_saved"] is None else f"{row['seconds_saved']:.3f}"
        lines.append(
            f"  {row['policy']:<6} {row['factor']:>5g}x {row['pool_blocks']:>7} "
            f"{row['hit_tokens']:>10} {row['pool_hit_rate']:>8.1%} {saved:>9} "
            f"{row['evicted_blocks']:>7} {row['in_flight_lookups']:>9} "
            f"{_ms(row['predicted_ttft_ms_p50']):>9} {_ms(row['predicted_ttft_ms_p95']):>9}"
        )
    return "\n".join(lines)


def _today_ttft(engine: dict) -> str:
    if not engine["priced_requests"]:
        return "no measured TTFT (vLLM's llm_request spans) to predict TTFT from"
    return (
        f"TTFT today p50 {_ms(engine['measured_ttft_ms_p50'])}, p95 "
        f"{_ms(engine['measured_ttft_ms_p95'])} over {engine['priced_requests']} requests"
    )


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f}"
