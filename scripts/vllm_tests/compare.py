"""Compares vLLM's own tests run bare and wrapped (JUnit XML of each): every test that passes bare
and fails wrapped fails the lane unless known.py lists it with its reason.

python scripts/vllm_tests/compare.py BARE.xml WRAPPED.xml WRAP   # WRAP: traced or multi
"""

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from fnmatch import fnmatchcase
from pathlib import Path

from known import KNOWN

PASSED = "passed"


def outcomes(junit: Path) -> dict[str, str]:
    """Test id ("module.path::name[params]") -> passed, failed, error or skipped."""
    found = {}
    for case in ET.parse(junit).iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcome = PASSED
        if "failure" in kinds:
            outcome = "failed"
        elif "error" in kinds:
            outcome = "error"
        elif "skipped" in kinds:
            outcome = "skipped"
        found[test] = outcome
    return found


def reason_known(test: str, wrap: str) -> str | None:
    """The listed reason a test may pass bare and fail under `wrap`, if it is listed."""
    for pattern, (wraps, reason) in KNOWN.items():
        if wrap in wraps and fnmatchcase(test, pattern):
            return reason
    return None


def compare(bare: dict[str, str], wrapped: dict[str, str], wrap: str) -> list[str]:
    """Prints the tally and every change; returns the tests that changed and are not listed."""
    pairs = Counter((bare[t], wrapped.get(t, "missing")) for t in bare)
    print(f"vLLM's own tests, bare against {wrap}: {len(bare)} tests")
    for (was, now), count in sorted(pairs.items()):
        print(f"  {was:>8} -> {now:<8} {count}")
    unlisted = []
    for test in sorted(bare):
        was, now = bare[test], wrapped.get(test, "missing")
        if was != PASSED or now == PASSED:
            if was != PASSED and now == PASSED:
                print(f"  fixed by wrapping? {test} ({was} bare)")
            continue
        reason = reason_known(test, wrap)
        if reason:
            print(f"  listed: {test} ({now}): {reason}")
        else:
            unlisted.append(test)
            print(f"  CHANGED: {test} passes bare, {now} {wrap}")
    unused = [
        p
        for p, (wraps, _) in KNOWN.items()
        if wrap in wraps and not any(fnmatchcase(t, p) for t in bare)
    ]
    for pattern in unused:
        print(f"  known.py lists {pattern}, which did not run")
    return unlisted


def main(argv: list[str]) -> int:
    bare, wrapped, wrap = Path(argv[0]), Path(argv[1]), argv[2]
    unlisted = compare(outcomes(bare), outcomes(wrapped), wrap)
    if unlisted:
        print(
            f"{len(unlisted)} of vLLM's tests pass bare and fail {wrap}: fix the wrapper, or list"
            " the test in scripts/vllm_tests/known.py with why it cannot hold"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
