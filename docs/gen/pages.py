"""The reference pages: each file under docs/reference/ and the module that renders it."""

import sys
from collections.abc import Callable
from pathlib import Path

from docs.gen import cli_ref, config_ref, env_ref, metrics_ref, rest_ref, spans_ref

REFERENCE = Path(__file__).resolve().parents[1] / "reference"
PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": config_ref.render,
    "environment.md": env_ref.render,
    "spans.md": spans_ref.render,
    "metrics.md": metrics_ref.render,
    "rest-api.md": rest_ref.render,
    "cli.md": cli_ref.render,
}
"""docs/reference/<name>: the function that writes it."""


def rendered() -> dict[str, str]:
    return {name: render() for name, render in PAGES.items()}


def differing(pages: dict[str, str]) -> list[str]:
    """The pages whose committed text is not what the code renders now."""
    return [
        name
        for name, text in pages.items()
        if not (REFERENCE / name).exists() or (REFERENCE / name).read_text() != text
    ]


def main(argv: list[str]) -> int:
    pages = rendered()
    if "--check" in argv:
        stale = differing(pages)
        for name in stale:
            print(f"docs/reference/{name} differs from the code", file=sys.stderr)
        if stale:
            print("run: python scripts/docs_reference.py", file=sys.stderr)
        return 1 if stale else 0
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, text in pages.items():
        (REFERENCE / name).write_text(text)
        print(f"wrote docs/reference/{name}")
    return 0
