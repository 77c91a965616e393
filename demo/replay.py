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


def replay(path: Path, backend_url: str, token: str | None = None, speed: float = 0.0) -> int:
    """POSTs each line to /v1/traces; speed > 0 spaces them out (lines per second)."""
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    lines = recorded_lines(path)
    sent = 0
    for line in lines:
        json.loads(line)  # a damaged recording stops here with the line it broke on
        request = urllib.request.Request(
            backend_url.rstrip("/") + "/v1/traces", data=line, headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
        sent += 1
        print(f"\rreplayed {sent}/{len(lines)} batches", end="", file=sys.stderr, flush=True)
        if speed > 0:
            time.sleep(1 / speed)
    print(file=sys.stderr)
    return sent
