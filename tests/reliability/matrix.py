"""What the three connector modules share: parametrizing cells by check, running a check."""

from collections.abc import Callable

import pytest

from tests.reliability.cases import CHECKS, Case
from tests.reliability.checks import CellRun, check_backend, check_leaks, check_outcome

KnownBug = Callable[[Case, str], str | None]
"""(case, check) -> why that check fails today (a strict xfail), or None."""


def cell_params(cells: list[Case], known_bug: KnownBug = lambda case, check: None) -> list:
    """(case, check) params in run order, a cell's three checks together."""
    params = []
    for case in cells:
        for check in CHECKS:
            reason = known_bug(case, check)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            params.append(
                pytest.param(case, check, id=f"{case.fault}-{case.policy}-{check}", marks=marks)
            )
    return params


def apply_check(check: str, run: CellRun, expected: dict[str, list[int]]) -> None:
    {
        "outcome": lambda: check_outcome(run, expected),
        "leaks": lambda: check_leaks(run),
        "backend": lambda: check_backend(run),
    }[check]()
