"""Compares the backend's rebuilt host-block and lease state with each server's own."""

import time

import httpx

from kvscope.bench.soak.checks import CheckResult
from kvscope.bench.soak.system import SERVERS, System


def _get(backend: str, path: str, **params) -> dict | list:
    answer = httpx.get(backend + path, params=params, timeout=30)
    answer.raise_for_status()
    return answer.json()


def _all_items(backend: str, path: str, **params) -> list[dict]:
    items: list[dict] = []
    while True:
        page = _get(backend, path, offset=len(items), limit=1000, **params)
        items += page["items"]
        if not page["items"] or len(items) >= page["total"]:
            return items


def differences(backend: str, state: dict) -> list[str]:
    """How the backend's view of one engine differs from the engine's own; empty when equal."""
    engine_id = state["engine_id"]
    offload, p2p = state.get("offload", {}), state.get("p2p", {})
    blocks = _all_items(backend, "/api/v1/blocks", engine_id=engine_id, tier="host", state="stored")
    rebuilt = {b["block_id"]: b["block_hash"] for b in blocks}
    own = {int(k): v for k, v in offload.get("stored", {}).items()}
    problems = []
    missing, extra = own.keys() - rebuilt.keys(), rebuilt.keys() - own.keys()
    changed = [i for i in own.keys() & rebuilt.keys() if own[i] != rebuilt[i]]
    for what, ids in (
        ("stored host blocks missing in the backend", missing),
        ("host blocks the backend thinks stored", extra),
        ("host blocks stored with another hash", changed),
    ):
        if ids:
            problems.append(f"{len(ids)} {what}: {sorted(ids)[:10]}")
    active = _all_items(backend, "/api/v1/leases", engine_id=engine_id, active="true")
    rebuilt_leases = sorted(lease["lease_id"] for lease in active)
    own_leases = sorted(
        [str(i) for i in offload.get("leases", [])] + [str(i) for i in p2p.get("held", {}).values()]
    )
    if rebuilt_leases != own_leases:
        problems.append(f"active leases: backend {rebuilt_leases[:10]}, engine {own_leases[:10]}")
    return problems


def stream_gaps(backend: str, engine_id: str) -> list[str]:
    """What the backend itself says it missed for this engine's processes."""
    gaps = []
    for stream in _get(backend, "/api/v1/streams"):
        if stream["engine_id"] == engine_id and stream["status"] != "complete":
            holes = [(h["first"], h["last"], h["state"]) for h in stream["holes"]][:5]
            gaps.append(
                f"{stream['service_name']} {stream['origin']}: {stream['status']}, "
                f"holes {holes}, dropped {stream['telemetry_dropped']}"
            )
    return gaps


def rebuilt_state_matches(system: System, timeout_s: float = 30.0) -> CheckResult:
    """Equal for every engine (retried while spans are in flight), or the gap the backend
    reports for it; a difference with no reported gap fails."""
    backend = system.urls["backend"]
    deadline = time.monotonic() + timeout_s
    while True:
        found = {}
        for role in SERVERS:
            state = system.connector_state(role)
            found[role] = (
                ["probe state unavailable"] if state is None else differences(backend, state)
            )
        if not any(found.values()) or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    details, unexplained = [], 0
    for role, problems in found.items():
        state = system.connector_state(role) or {}
        gaps = stream_gaps(backend, state.get("engine_id", "?")) if problems else []
        unexplained += len(problems) if not gaps else 0
        details += [f"{role}: {p}" for p in problems]
        details += [f"{role}: backend reports gap: {g}" for g in gaps]
        stored = len((state.get("offload") or {}).get("stored", {}))
        details.append(
            f"{role}: {stored} host blocks stored, {'equal' if not problems else 'differs'}"
        )
    return CheckResult("rebuilt state differences", unexplained == 0, unexplained, details)


def lease_rows_match(system: System) -> CheckResult:
    """Every lease a connector acquired is one lease row in the backend (none merged, none
    lost); the figure is how many are missing."""
    backend, missing, details = system.urls["backend"], 0, []
    for role in SERVERS:
        state = system.connector_state(role) or {}
        offload, p2p = state.get("offload", {}), state.get("p2p", {})
        acquired = offload.get("leases_acquired", 0) + p2p.get("leases_acquired", 0)
        rows = _get(backend, "/api/v1/leases", engine_id=state.get("engine_id", "?"), limit=1)
        missing += abs(acquired - rows["total"])
        details.append(
            f"{role}: {acquired} leases acquired (offload "
            f"{offload.get('leases_acquired', 0)}, p2p {p2p.get('leases_acquired', 0)})"
            f", {rows['total']} lease rows in the backend"
        )
    return CheckResult("leases missing in the backend", missing == 0, missing, details)


def backend_activity(backend: str, window_s: float) -> list[str]:
    """What the backend saw: hits per Multi child and failures by cause (faults exercised)."""
    lines = []
    try:
        for hit in _get(backend, "/api/v1/stats/hits", window_s=window_s):
            if hit["child"]:
                lines.append(
                    f"{hit['child']}: {hit['hit_requests']} of {hit['requests']} "
                    f"lookups hit, {hit['external_hit_tokens']} tokens"
                )
        summary = _get(backend, "/api/v1/stats/summary", window_s=window_s)
    except httpx.HTTPError as exc:
        return [f"backend unreadable: {exc}"]
    failures = ", ".join(f"{n} {cause}" for cause, n in sorted(summary["failures"].items()))
    lines.append(f"failures recorded: {failures or 'none'}")
    return lines
