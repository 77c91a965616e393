"""Counts a demo run's injected faults against the failure incidents its backend shows.

Each fault the demo injects hits one offload load: a load the plan fails (its transfer span
ends not ok, cause InjectedFault) or one slowed past the load timeout (the offload child's
load_failed report, cause timeout). The failures page should show one incident per fault,
whatever number of reports (transfer, child, Multi, vLLM's block view) each one made.
Usage: python -m kvscope.demo.fault_check http://127.0.0.1:4318
"""

import argparse
import json
import sys
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class FaultCount:
    failed_loads: int  # load transfers that ended not ok
    timed_out_loads: int  # loads the offload connector gave up on at its timeout
    reports: int
    incidents: int
    incidents_by_cause: Counter = field(default_factory=Counter)
    without_cause: int = 0  # incidents whose only cause is generic ('load_error')

    @property
    def injected(self) -> int:
        return self.failed_loads + self.timed_out_loads

    def line(self) -> str:
        causes = ", ".join(f"{cause} {n}" for cause, n in self.incidents_by_cause.most_common())
        return (
            f"injected faults {self.injected} ({self.failed_loads} failed loads, "
            f"{self.timed_out_loads} timed out); {self.reports} failure reports folded into "
            f"{self.incidents} incidents ({causes or 'none'}; {self.without_cause} without a "
            "specific cause)"
        )


def _all(base: str, path: str, **params) -> list[dict]:
    """Every item of a paged list route."""
    items: list[dict] = []
    while True:
        query = urllib.parse.urlencode({**params, "offset": len(items), "limit": 1000})
        with urllib.request.urlopen(f"{base}{path}?{query}", timeout=30) as response:
            page = json.loads(response.read())
        items.extend(page["items"])
        if not page["items"] or len(items) >= page["total"]:
            return items


def count(base: str) -> FaultCount:
    failed = _all(base, "/api/v1/transfers", direction="load", ok="false")
    timed_out = _all(base, "/api/v1/failures", kind="load_failed", cause="timeout")
    with urllib.request.urlopen(f"{base}/api/v1/failures/incidents?limit=1", timeout=30) as r:
        reports = json.loads(r.read())["reports"]
    incidents = _all(base, "/api/v1/failures/incidents")
    causes = Counter((i["cause"] or "").split(":", 1)[0] for i in incidents)
    return FaultCount(
        failed_loads=len(failed),
        timed_out_loads=len(timed_out),
        reports=reports,
        incidents=len(incidents),
        incidents_by_cause=causes,
        without_cause=sum(i["cause"] in (None, "", "load_error") for i in incidents),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", help="the demo backend's URL (e.g. http://127.0.0.1:4318)")
    found = count(parser.parse_args(argv).backend.rstrip("/"))
    print(found.line())
    ok = found.incidents == found.injected and found.without_cause == 0
    print("one incident per injected fault" if ok else "MISMATCH: incidents != injected faults")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
