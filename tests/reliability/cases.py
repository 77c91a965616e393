"""The fault matrix: (connector, fault, policy) cells, what each must show, and the N/A cells."""

import random
from dataclasses import dataclass

from kvscope.harness.prompts import long_prompt

RECOMPUTE, FAIL = "recompute", "fail"
CHECKS = ("outcome", "leaks", "backend")
"""Every cell is checked three ways: tokens (or a prompt error), nothing leaked, the backend."""


@dataclass(frozen=True)
class Case:
    """One cell. `expect` is what the requests must end as: 'tokens' (equal to the oracle's,
    whatever went wrong underneath) or 'error' (failed promptly, under policy 'fail').
    `cause` and `outcome` are what the backend must show for it (None: no failure row)."""

    connector: str  # offload | p2p | multi
    fault: str
    policy: str
    expect: str = "tokens"
    cause: str | None = None  # a substring of a failure row's cause
    outcome: str | None = None  # a failure row's outcome
    max_tokens: int = 16
    num_prompts: int = 2

    @property
    def id(self) -> str:
        return f"{self.connector}-{self.fault}-{self.policy}"

    def prompts(self) -> list[str | dict]:
        """Prompts of this cell alone: their first block differs from every other cell's."""
        if self.fault.endswith("_whole"):
            # 4 blocks + 1 token: the P2P hit (all but the last token) is whole blocks, all
            # of which the offload pool holds.
            draw = random.Random(self.id)
            return [
                {"prompt_token_ids": [draw.randrange(10, 2000) for _ in range(4 * 32 + 1)]}
                for _ in range(self.num_prompts)
            ]
        sentences = 6 if self.fault == "preempted" else 4
        return [f"[{self.id} #{i}] " + long_prompt(i, sentences) for i in range(self.num_prompts)]


def _failing(connector: str, fault: str, cause: str, **extra) -> list[Case]:
    """A fault that fails the load: recomputed under 'recompute', an error under 'fail'."""
    return [
        Case(connector, fault, RECOMPUTE, "tokens", cause, "recomputed", **extra),
        Case(connector, fault, FAIL, "error", cause, "failed", **extra),
    ]


def _harmless(connector: str, fault: str, policies=(RECOMPUTE, FAIL), **extra) -> list[Case]:
    """A fault the request must not notice: the same tokens under either policy."""
    return [Case(connector, fault, policy, "tokens", **extra) for policy in policies]


PREEMPT = {"max_tokens": 160, "num_prompts": 4}
"""4 requests of 5 blocks fit 24 (pulled at once, within the prefill lease); grown by 5
blocks each while decoding, they do not: vLLM preempts."""

CASES: list[Case] = [
    # --- CPU offload (one in-process engine per policy; faults change at runtime) ---
    *_failing("offload", "load_fails", "InjectedFault"),
    *_failing("offload", "load_slow", "timeout"),
    *_harmless(
        "offload", "lease_expires", cause="lease_expired during its load", outcome="kept_pinned"
    ),
    *_harmless("offload", "aborted"),
    *_harmless("offload", "preempted", **PREEMPT),
    *_harmless("offload", "backend_down", (RECOMPUTE,)),
    *_harmless("offload", "queue_full", (RECOMPUTE,)),
    # --- P2P (decode engine in-process, prefill engine in a subprocess) ---
    # peer_hangs, then aborted, first on each engine: both need a peer not met yet.
    *_failing("p2p", "peer_hangs", "peer_unreachable"),
    *_harmless("p2p", "aborted"),
    *_failing("p2p", "load_fails", "read_failed: bad block ids"),
    *_failing("p2p", "lease_expires", "lease_expired"),
    *_failing("p2p", "peer_killed", "read_failed|peer_unreachable"),
    *_harmless("p2p", "preempted", **PREEMPT),
    *_harmless("p2p", "backend_down", (RECOMPUTE,)),
    *_harmless("p2p", "queue_full", (RECOMPUTE,)),
    # --- Multi: P2P first, then CPU offload ---
    *_failing("multi", "peer_hangs", "peer_unreachable"),
    *_harmless("multi", "aborted"),
    *_failing("multi", "load_fails", "InjectedFault"),  # the offload child's load
    *_harmless(
        "multi", "p2p_fails_offload_has_whole", cause="load_error", outcome="served_by_fallback"
    ),
    # The pool lacks the hit's last, partial block: vLLM's policy takes that part.
    *_failing("multi", "p2p_fails_offload_has_part", "load_error"),
    *_failing("multi", "load_slow", "timeout"),
    *_failing("multi", "lease_expires", "lease_expired"),
    *_failing("multi", "peer_killed", "read_failed|peer_unreachable"),
    *_harmless("multi", "preempted", **PREEMPT),
    *_harmless("multi", "backend_down", (RECOMPUTE,)),
    *_harmless("multi", "queue_full", (RECOMPUTE,)),
]

NOT_APPLICABLE: dict[tuple[str, str], str] = {
    ("offload", "peer_killed"): "no peer: the host pool lives in the engine's own process",
    ("offload", "peer_hangs"): "no peer; a copy that never finishes is the load_slow cell",
    ("p2p", "load_slow"): "the P2P connector has no load-delay fault hook; a read that outlasts "
    "read_timeout_s is what a hung peer gives (peer_hangs; read timeouts on a stopped owner are "
    "tests/connector/p2p/transport/test_p2p_faults.py)",
    ("*", "backend_down/fail"): "no load fails, so the policy changes nothing: run once",
    ("*", "queue_full/fail"): "no load fails, so the policy changes nothing: run once",
}


def cases_for(connector: str) -> list[Case]:
    """This connector's cells, recompute ones first (one engine per policy, in turn)."""
    cells = [case for case in CASES if case.connector == connector]
    return sorted(cells, key=lambda case: case.policy != RECOMPUTE)
