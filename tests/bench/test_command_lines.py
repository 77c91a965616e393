"""Every bench's command line as the report runs it (no arguments, quick, full) and as the README
and docs/bench give it is accepted by the bench's own argument parser, defaults included.

argparse type-checks string defaults only when it parses, so a bench whose default its own check
refuses cannot start at all (the tracing bench's --label did): the bench's `main` runs here until
its arguments are parsed, then stops, so no engine or server is started.
"""

import argparse
import importlib
import inspect
import re
import shlex
import sys
from pathlib import Path

import pytest

from kvscope.bench.report.benches import BENCHES

REPO = Path(__file__).resolve().parents[2]
DOCUMENTED = re.compile(r"python -m (kvscope\.bench\.[a-z_.]+)([^`|#\n]*)")
"""A bench's command in a README or docs/bench page, up to a comment, table cell or quote."""
PLACEHOLDER = re.compile(r"[\[\]<>~]|\b[A-Z][A-Z_]+\b|\.\.\.|\\$")
"""What marks a command as a template for the reader (usage brackets, NAMES, ~paths, ...)."""


class Parsed(Exception):
    """Raised in place of the bench running: its arguments were accepted."""


def documented_commands() -> set[tuple[str, tuple[str, ...]]]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = set()
    for page in pages:
        for module, rest in DOCUMENTED.findall(page.read_text()):
            rest = rest.strip().rstrip(":.,;")
            if PLACEHOLDER.search(rest):
                rest = ""  # a usage line: its bare command still has to start
            found.add((module, tuple(shlex.split(rest))))
    return found


def report_commands() -> set[tuple[str, tuple[str, ...]]]:
    found = set()
    for spec in BENCHES:
        module = spec.command[spec.command.index("-m") + 1]
        for args in ([], spec.quick_args, spec.full_args):
            found.add((module, tuple(args)))
    return found


COMMANDS = sorted(documented_commands() | report_commands())


def entry_point(module_name: str):
    module = importlib.import_module(module_name)
    if not hasattr(module, "main"):
        module = importlib.import_module(f"{module_name}.__main__")
    return module.main


def test_the_docs_and_the_report_give_command_lines():
    modules = {module for module, _ in COMMANDS}
    assert {
        "kvscope.bench.engine.tracing_overhead",
        "kvscope.bench.transfer.copy_bandwidth",
    } <= modules
    assert len(COMMANDS) >= 20, COMMANDS


@pytest.mark.parametrize(
    ("module", "args"), COMMANDS, ids=[" ".join((m.split(".")[-1], *a)) for m, a in COMMANDS]
)
def test_the_bench_accepts_its_documented_command_line(module, args, monkeypatch):
    real_parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, argv=None, namespace=None):
        real_parse(self, argv, namespace)  # exits 2, as the bench would, on a refused argument
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    main = entry_point(module)
    with pytest.raises(Parsed):
        if inspect.signature(main).parameters:
            main(list(args))
        else:  # reads sys.argv, as `python -m` gives it
            monkeypatch.setattr(sys, "argv", [module, *args])
            main()
