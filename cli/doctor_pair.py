"""`kvscope doctor --pair PREFILL_URL DECODE_URL`: do two servers agree on the KV they trade?"""

from dataclasses import dataclass

from kvscope.cli.pair_probe import ServerFacts, probe

COMPARED = (
    ("model", "model"),
    ("block_size", "block size (tokens)"),
    ("enable_prefix_caching", "prefix caching on"),
    ("prefix_caching_hash_algo", "prefix-caching hash algorithm"),
    ("hash_seed", "prefix-caching hash seed"),
    ("kv_cache_dtype", "KV cache dtype"),
    ("tensor_parallel_size", "tensor parallel size"),
    ("kv_layout", "KV layout"),
    ("kv_heads", "KV heads"),
    ("head_dim", "head dim"),
    ("kv_dtype", "KV dtype (as registered)"),
)
"""What a prefill and a decode server must share, or hits drop to 0 or KV is read wrongly."""


@dataclass(frozen=True)
class PairCheck:
    """One compared fact: 'agree', 'mismatch' or 'cannot tell' (one side does not expose it)."""

    name: str
    label: str
    verdict: str
    prefill: str | None
    decode: str | None
    why: str = ""


def compare(prefill: ServerFacts, decode: ServerFacts) -> list[PairCheck]:
    checks = []
    for name, label in COMPARED:
        left, right = prefill.facts.get(name), decode.facts.get(name)
        if left is None or right is None:
            side, facts = ("prefill", prefill) if left is None else ("decode", decode)
            why = f"{side}: {facts.unknown.get(name, 'not exposed')}"
            checks.append(PairCheck(name, label, "cannot tell", left, right, why))
        else:
            verdict = "agree" if left == right else "mismatch"
            checks.append(PairCheck(name, label, verdict, left, right))
    return checks


def check_pair(
    prefill_url: str,
    decode_url: str,
    prefill_side_channel: str | None = None,
    decode_side_channel: str | None = None,
    timeout_s: float = 10.0,
) -> tuple[list[PairCheck], list[str]]:
    """The comparisons, and what could not be reached (each naming its server)."""
    prefill = probe(prefill_url, prefill_side_channel, timeout_s)
    decode = probe(decode_url, decode_side_channel, timeout_s)
    errors = [f"prefill {e}" for e in prefill.errors] + [f"decode {e}" for e in decode.errors]
    return compare(prefill, decode), errors


def run_pair(prefill_url: str, decode_url: str, **options) -> int:
    """Prints one line per fact; exit status 1 on any mismatch, or when a server is unreachable."""
    checks, errors = check_pair(prefill_url, decode_url, **options)
    print(f"kvscope doctor --pair: prefill {prefill_url}, decode {decode_url}")
    marks = {"agree": "ok  ", "mismatch": "FAIL", "cannot tell": "?   "}
    for check in checks:
        if check.verdict == "agree":
            detail = check.prefill
        elif check.verdict == "mismatch":
            detail = f"MISMATCH: prefill {check.prefill}, decode {check.decode}"
        else:
            detail = f"cannot tell ({check.why})"
        print(f"[{marks[check.verdict]}] {check.label}: {detail}")
    for error in errors:
        print(f"[warn] {error}")
    mismatched = [c.label for c in checks if c.verdict == "mismatch"]
    unreachable = any(c.name == "model" and c.verdict == "cannot tell" for c in checks)
    if mismatched:
        print("kvscope doctor --pair: the servers disagree on " + ", ".join(mismatched))
    elif unreachable:
        print("kvscope doctor --pair: a server did not answer /v1/models")
    else:
        print("kvscope doctor --pair: no mismatch among what the servers expose")
    return 1 if mismatched or unreachable else 0
