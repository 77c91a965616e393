"""Pure builders for the P2P transport truth: a request's TTFT split and its reads' paths."""

import altair as alt
import pandas as pd

from kvscope.dashboard.charts.format import human_bytes

SPLIT_PARTS = {
    "server_ms": "API server",
    "queue_ms": "queue",
    "handshake_ms": "handshake",
    "read_ms": "read",
    "first_decode_step_ms": "first decode step",
}
READ_COLUMNS = [
    "backend",
    "UCX lanes",
    "scope",
    "memory",
    "bytes",
    "ms",
    "GB/s",
    "expected GB/s",
    "line GB/s",
    "flags",
    "ok",
]
FLAG_WORDS = {
    "tcp_staged": "TCP-staged",
    "under_1gbps": "under 1 GB/s",
    "above_line_rate": "above line rate",
}


def split_frame(split: dict) -> pd.DataFrame:
    """The decode-side TTFT's consecutive parts (ms), in order; empty when none is known."""
    rows = [
        {"part": label, "ms": round(split[key], 3)}
        for key, label in SPLIT_PARTS.items()
        if split.get(key) is not None
    ]
    return pd.DataFrame(rows, columns=["part", "ms"])


def split_sentence(split: dict) -> str:
    """'P/D TTFT 81.2 ms = API server 2.1 + queue 9.1 + handshake 33.8 + read 17.5 + first
    decode step 18.7 ms' (no API server part without vLLM's own TTFT)."""
    if split.get("ttft_ms") is None:
        return "P/D TTFT split: " + ("; ".join(split.get("missing") or ["not recorded"]))
    known = [(label, split[k]) for k, label in SPLIT_PARTS.items() if split.get(k) is not None]
    parts = " + ".join(f"{label} {ms:.1f}" for label, ms in known)
    return f"P/D TTFT {split['ttft_ms']:.1f} ms = {parts} ms"


def split_chart(parts: pd.DataFrame) -> alt.Chart:
    order = list(SPLIT_PARTS.values())
    return (
        alt.Chart(parts)
        .mark_bar(size=28)
        .encode(
            x=alt.X("sum(ms):Q", title="ms", stack="zero"),
            color=alt.Color("part:N", sort=order, legend=alt.Legend(orient="top", title=None)),
            y=alt.Y("bar:N", title=None),
            order=alt.Order("order:Q"),
            tooltip=["part:N", "ms:Q"],
        )
        .transform_calculate(order=f"indexof({order}, datum.part)", bar="'P/D TTFT'")
        .properties(height=120)
    )


def _rate(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


def reads_frame(reads: list[dict]) -> pd.DataFrame:
    """One row per P2P read: the path NIXL/UCX used, its rate against the path's, its flags."""
    rows = [
        {
            "backend": read["backend"],
            "UCX lanes": ", ".join(read["ucx_lanes"]) or "unknown",
            "scope": read["ucx_scope"],
            "memory": read["memory"],
            "bytes": human_bytes(read["bytes"]),
            "ms": round(read["duration_ms"], 3),
            "GB/s": round(read["gbps"], 4),
            "expected GB/s": _rate(read["expected_gbps"]),
            "line GB/s": _rate(read["line_gbps"]),
            "flags": ", ".join(FLAG_WORDS.get(f, f) for f in read["flags"]) or "none",
            "ok": read["ok"],
        }
        for read in reads
    ]
    return pd.DataFrame(rows, columns=READ_COLUMNS)
