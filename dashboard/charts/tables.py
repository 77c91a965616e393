"""Tables of requests, leases, failures and transfers, in the words and units a reader wants."""

import json

import pandas as pd

from kvscope.dashboard.charts.format import clock, engine_name, human_bytes, short_cause

EXPIRED_STYLE = "background-color: #fde0dc; color: #8b1a10"


def requests_table(items: list[dict], labels: dict[str, str] | None = None) -> pd.DataFrame:
    rows = [
        {
            "key": item["id"],
            "request": item["request_id"],
            "status": item["status"],
            "connector": item["connector"],
            "engine": engine_name(item["engine_id"], labels),
            "role": item["kv_role"],
            "prompt tokens": item["prompt_tokens"],
            "started": clock(item["start_ns"]),
            "duration ms": None if item["duration_ms"] is None else round(item["duration_ms"], 1),
        }
        for item in items
    ]
    columns = ["key", "request", "status", "connector", "engine", "role", "prompt tokens"]
    return pd.DataFrame(rows, columns=columns + ["started", "duration ms"])


def lease_state(lease: dict) -> str:
    """'held', 'overdue' (past expiry, no end seen) or how the lease ended."""
    if lease["active"]:
        return "overdue" if lease["overdue"] else "held"
    return lease["outcome"] or "ended"


def leases_table(
    items: list[dict], now_ns: int, labels: dict[str, str] | None = None
) -> pd.DataFrame:
    """Leases with holder, age against their timeout and seconds to expiry (negative past it)."""
    rows = []
    for lease in items:
        to_expiry = None
        if lease["active"] and lease["expires_ns"] is not None:
            to_expiry = round((lease["expires_ns"] - now_ns) / 1e9, 1)
        age = lease["age_s"]
        if lease["active"] and lease["acquired_ns"] is not None:
            age = (now_ns - lease["acquired_ns"]) / 1e9  # the backend's age is as of its read
        rows.append(
            {
                "lease": lease["lease_id"],
                "state": lease_state(lease),
                "holder request": lease["holder"],
                "engine": engine_name(lease["engine_id"], labels),
                "host blocks": len(json.loads(lease["host_block_ids"] or "[]")),
                "acquired": clock(lease["acquired_ns"]),
                "age s": None if age is None else round(age, 3),
                "of timeout %": _share(age, lease.get("timeout_s")),
                "expires in s": to_expiry,
                "certain": lease["certain"],
            }
        )
    columns = ["lease", "state", "holder request", "engine", "host blocks", "acquired"]
    return pd.DataFrame(
        rows, columns=columns + ["age s", "of timeout %", "expires in s", "certain"]
    )


def _share(age: float | None, timeout_s: float | None) -> float | None:
    return round(100 * age / timeout_s, 1) if age is not None and timeout_s else None


def highlight_expired(table: pd.DataFrame):
    """Expired and overdue leases stand out in red; the rest stay plain."""

    def row_style(row: pd.Series) -> list[str]:
        bad = row["state"] in ("expired", "overdue")
        return [EXPIRED_STYLE if bad else ""] * len(row)

    return table.style.apply(row_style, axis=1).format(precision=3, na_rep="–")


def failures_table(items: list[dict], labels: dict[str, str] | None = None) -> pd.DataFrame:
    rows = [
        {
            "time": clock(item["time_ns"]),
            "kind": item["kind"],
            "cause": short_cause(item["cause"]) if item["cause"] else "–",
            "policy": item["policy"] or "–",
            "outcome": item["outcome"] or "–",
            "request": item["request_id"] or "–",
            "engine": engine_name(item["engine_id"], labels),
            "lease": item["lease_id"] or "–",
            "blocks": ", ".join(map(str, json.loads(item["block_ids"] or "[]"))) or "–",
            "detail": item["cause"] or "",
        }
        for item in items
    ]
    columns = ["time", "kind", "cause", "policy", "outcome", "request", "engine", "lease"]
    return pd.DataFrame(rows, columns=columns + ["blocks", "detail"])


def transfers_table(items: list[dict]) -> pd.DataFrame:
    rows = [
        {
            "started": clock(item["start_ns"]),
            "direction": item["direction"],
            "peer": item["peer"],
            "bytes": human_bytes(item["bytes"]),
            "ms": None if item["duration_ms"] is None else round(item["duration_ms"], 3),
            "GB/s": None if item["gbps"] is None else round(item["gbps"], 3),
            "ok": item["ok"],
        }
        for item in items
    ]
    return pd.DataFrame(rows, columns=["started", "direction", "peer", "bytes", "ms", "GB/s", "ok"])


def chain_text(incident: dict) -> str:
    """cause -> policy -> outcome, with the child that failed and the one that served."""
    cause = short_cause(incident["cause"])
    if incident.get("failed_child"):
        cause = f"{cause} in {incident['failed_child']}"
    outcome = incident["outcome"] or "outcome not reported"
    if incident.get("outcome_inferred"):
        outcome += " (by policy)"
    if incident.get("fallback_child"):
        outcome += f" by {incident['fallback_child']}"
    return f"{cause} → {incident['policy'] or 'no policy'} → {outcome}"


def incidents_table(items: list[dict], labels: dict[str, str] | None = None) -> pd.DataFrame:
    """One row per failure incident, its reports folded in."""
    rows = [
        {
            "time": clock(item["time_ns"]),
            "kind": item["kind"].replace("_", " "),
            "chain": chain_text(item),
            "request": item["request_id"] or "–",
            "engine": engine_name(item["engine_id"], labels),
            "reports": item["reports"],
            "blocks": ", ".join(map(str, item["block_ids"])) or "–",
            "detail": " · ".join(
                f"{step['kind']}: {step['cause'] or '–'}" for step in item["chain"]
            ),
        }
        for item in items
    ]
    columns = ["time", "kind", "chain", "request", "engine", "reports", "blocks", "detail"]
    return pd.DataFrame(rows, columns=columns)
