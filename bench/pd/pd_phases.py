"""Where a P/D request's time goes: gaps between its timeline points in both servers' span files.

For sequential requests (one at a time) with known send times: the first request each server
looks up inside a request's window is that request there, and its points are the ones with
its request id. The critical path, in order: the
client sends, the prefill engine looks the request up and finishes it, the decode engine looks
it up, submits the NIXL read, collects it done, resumes the request and starts its forward, the
client gets the first token. Beside it: when the prefill side heard the read was done (it then
frees its blocks; the first token does not wait for it).
"""

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

POINTS = (
    "client_send",
    "prefill.lookup",
    "prefill.finished",
    "decode.lookup",
    "decode.transfer_submitted",
    "decode.transfer_complete",
    "decode.resumed",
    "decode.forward_start",
    "client_first_token",
)
"""The critical path's points in order; a gap is the time from one to the next."""

SIDE_GAPS = (("decode.transfer_submitted", "prefill.send_complete"),)
"""Gaps off the critical path."""


@dataclass(frozen=True)
class TimedRequest:
    """One request as the client saw it, in Unix seconds."""

    sent: float
    first_token: float
    done: float


Point = tuple[float, str, str]  # Unix time, 'role.point', request id


def server_points(spans_file: Path, role: str) -> list[Point]:
    """Every lookup, finish and timeline event in one server's span file."""
    points = []
    for line in spans_file.read_text(encoding="utf-8").splitlines():
        for span in _spans(json.loads(line)) if line.strip() else ():
            req_id = _attribute(span, _REQUEST_ID) or ""
            start = int(span["startTimeUnixNano"]) / 1e9
            if span["name"] == "kvscope.request":
                points.append((start, f"{role}.lookup", req_id))
            elif span["name"] == "kvscope.hook.request_finished":
                points.append((start, f"{role}.finished", req_id))
            for event in span.get("events", ()):
                if point := _attribute(event, "kvscope.timeline.point"):
                    points.append((int(event["timeUnixNano"]) / 1e9, f"{role}.{point}", req_id))
    return sorted(points)


_REQUEST_ID = "gen_ai.request.id"


def _spans(request: dict) -> list[dict]:
    scopes = [s for r in request.get("resourceSpans", ()) for s in r.get("scopeSpans", ())]
    return [span for scope in scopes for span in scope.get("spans", ())]


def _attribute(item: dict, key: str) -> str | None:
    for attribute in item.get("attributes", ()):
        if attribute["key"] == key:
            return attribute["value"].get("stringValue")
    return None


def gap_names() -> list[tuple[str, str]]:
    return [*zip(POINTS, POINTS[1:], strict=False), *SIDE_GAPS]


def request_gaps(request: TimedRequest, points: list[Point]) -> list[float]:
    """Milliseconds of each gap_names() gap of one request (NaN where a point is missing)."""
    seen = {"client_send": request.sent, "client_first_token": request.first_token}
    ours: dict[str, str] = {}  # role -> the request id this request has on that server
    for when, name, req_id in points:
        role = name.split(".")[0]
        if name.endswith(".lookup") and request.sent <= when <= request.done:
            ours.setdefault(role, req_id)
        if ours.get(role) == req_id:
            seen.setdefault(name, when)  # the first one: a decode request has 2 worker steps
    return [
        (seen[b] - seen[a]) * 1000 if a in seen and b in seen else float("nan")
        for a, b in gap_names()
    ]


def report_phases(requests: list[TimedRequest], workdir: Path, label: str) -> None:
    """Prints median gaps of the faster and the slower half of the requests, and the worst."""
    files = {role: workdir / f"{role}_spans.jsonl" for role in ("prefill", "decode")}
    if not requests or not all(path.exists() for path in files.values()):
        print(f"[{label}] no phase breakdown: no span files in {workdir}")
        return
    points = sorted(p for role, path in files.items() for p in server_points(path, role))
    rows = sorted((r.first_token - r.sent, request_gaps(r, points)) for r in requests)
    fast, slow = rows[: len(rows) // 2] or rows, rows[len(rows) // 2 :]
    ttft_ms = [ttft * 1000 for ttft, _ in rows]
    print(
        f"[{label}] where the time goes, ms: TTFT of the faster half up to"
        f" {ttft_ms[len(fast) - 1]:.0f}, of the slower half from {ttft_ms[len(rows) // 2]:.0f},"
        f" worst {ttft_ms[-1]:.0f}"
    )
    print(f"  {'from -> to':<54}{'faster':>8}{'slower':>8}{'worst':>8}")
    for index, (a, b) in enumerate(gap_names()):
        columns = [_median(g[index] for _, g in half) for half in (fast, slow)]
        print(
            f"  {a + ' -> ' + b:<54}{columns[0]:>8.1f}{columns[1]:>8.1f}{rows[-1][1][index]:>8.1f}"
        )


def _median(values) -> float:
    kept = [v for v in values if v == v]
    return statistics.median(kept) if kept else float("nan")
