"""Expected figures of the soak: correctness, leaks, throughput under faults, memory growth."""

from kvscope.bench.report.figures.figure import Figure

SOAK_FIGURES: list[Figure] = [
    Figure(
        "soak",
        "token_mismatches",
        "count",
        "== 0",
        "soak requests whose greedy tokens differ from a reference engine's",
    ),
    Figure("soak", "leaks", "count", "== 0", "blocks or leases still held once the soak drained"),
    Figure("soak", "hung", "count", "== 0", "soak requests that never ended"),
    Figure(
        "soak",
        "rebuilt_state_unexplained",
        "count",
        "== 0",
        "differences between the backend's rebuilt state and the servers' own",
    ),
    Figure(
        "soak",
        "leases_missing_in_backend",
        "count",
        "== 0",
        "leases the servers held that the backend never learnt of",
    ),
    Figure(
        "soak",
        "requests_per_s",
        "req/s",
        "",
        "completed soak requests per second (P/D + offload, faults on)",
    ),
    Figure(
        "soak",
        "faulted_over_clean_req_per_s",
        "ratio",
        ">= 0.5",
        "completed soak req/s with loads slower than their timeout over the clean phase before",
    ),
    Figure(
        "soak",
        "faulted_req_per_s",
        "req/s",
        "",
        "completed soak req/s with loads slower than their timeout (tier-health breaker on)",
    ),
    Figure(
        "soak",
        "clean_req_per_s",
        "req/s",
        "",
        "completed soak req/s in the clean phase right before the slow-load one",
    ),
    *(
        Figure(
            "soak",
            f"rss_growth_mib_{service}",
            "MiB",
            "<= 256",
            f"{service} memory growth over the soak's second half",
        )
        for service in ("prefill", "decode", "backend", "proxy")
    ),
]
"""soak, in table order."""
