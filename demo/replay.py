"""`kvscope replay`: feeds recorded OTLP/JSON lines into a backend, as the exporters sent them."""

import gzip
import json
import sys
import time
import urllib.request
from pathlib import Path

RECORDINGS = Path(__file__).resolve().parent.parent / "traces" / "recordings"
"""Where the repository keeps small recordings of real runs."""


def recorded_lines(path: Path) -> list[bytes]:
    """The non-empty lines of a recording (.jsonl or .jsonl.gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as lines:
        return [line.strip() for line in lines if line.strip()]


TIME_KEYS = ("startTimeUnixNano", "endTimeUnixNano", "timeUnixNano")


def shift_times(request: dict, delta_ns: int) -> None:
    """Moves every span and event time of one OTLP/JSON request by delta_ns."""
    for resource_spans in request.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                for item in (span, *span.get("events", ())):
                    for key in TIME_KEYS:
                        if key in item:
                            item[key] = str(int(item[key]) + delta_ns)


def latest_end_ns(lines: list[bytes]) -> int:
    return max(
        int(span["endTimeUnixNano"])
        for line in lines
        for rs in json.loads(line).get("resourceSpans", ())
        for ss in rs.get("scopeSpans", ())
        for span in ss.get("spans", ())
    )


def replay(
    path: Path, backend_url: str, token: str | None = None, speed: float = 0.0, now: bool = True
) -> int:
    """POSTs each line to /v1/traces; speed > 0 spaces them out (lines per second); now=True
    moves the recording's times so it ends now (dashboards show recent windows)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    lines = recorded_lines(path)
    delta_ns = time.time_ns() - latest_end_ns(lines) if now and lines else 0
    sent = 0
    for line in lines:
        body = json.loads(line)  # a damaged recording stops here with the line it broke on
        shift_times(body, delta_ns)
        request = urllib.request.Request(
            backend_url.rstrip("/") + "/v1/traces",
            data=json.dumps(body).encode(),
            headers=headers,
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
        sent += 1
        print(f"\rreplayed {sent}/{len(lines)} batches", end="", file=sys.stderr, flush=True)
        if speed > 0:
            time.sleep(1 / speed)
    print(file=sys.stderr)
    return sent
