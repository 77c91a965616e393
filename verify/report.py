"""Prints a verify report: a table of scenario, verdict and evidence, or JSON for CI."""

import json

from kvscope.verify.rules import RULES
from kvscope.verify.runner import Report

EVIDENCE_WIDTH = 110


def as_json(report: Report) -> str:
    return json.dumps(
        {
            "connector": report.connector,
            "passed": report.passed,
            "tensor_parallel_size": report.tensor_parallel_size,
            "rules": RULES,
            "scenarios": [r.to_dict() for r in report.results],
        },
        indent=2,
    )


def as_table(report: Report) -> str:
    rows = [("scenario", "verdict", "evidence")]
    for result in report.results:
        name = f"{result.scenario} [{result.policy}]"
        if result.skipped:
            rows.append((name, "skip", result.skipped))
        elif not result.violations:
            rows.append((name, "pass", "; ".join(result.notes)))
        for i, violation in enumerate(result.violations):
            rows.append(
                (
                    name if i == 0 else "",
                    "FAIL" if i == 0 else "",
                    f"{violation.rule}: {violation.evidence()}",
                )
            )
    width = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{row[0]:<{width[0]}}  {row[1]:<{width[1]}}  {_cut(row[2])}" for row in rows]
    lines.insert(1, "-" * min(sum(width) + 4 + EVIDENCE_WIDTH, 160))
    broken = sorted({v.rule for r in report.results for v in r.violations})
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(f"\n{report.connector}: {verdict}")
    lines += [f"  {rule}: {RULES[rule]}" for rule in broken]
    return "\n".join(lines)


def _cut(text: str) -> str:
    return text if len(text) <= EVIDENCE_WIDTH else text[: EVIDENCE_WIDTH - 3] + "..."
