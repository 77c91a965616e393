"""Reads what the code says of its own names: constants' docstrings and fields' comments."""

import ast
import inspect
import io
import re
import tokenize
from pathlib import Path
from types import ModuleType

LABEL = re.compile(r"^[A-Z]\w+: ")
"""A comment that labels the run of fields below it ("Retention: ...")."""


def _comments(source: str) -> dict[int, str]:
    """{line number: comment text} of every comment in source."""
    found = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            found[token.start[0]] = token.string.lstrip("#").strip()
    return found


def _clean(text: str) -> str:
    return " ".join(text.split())


def _notes(body: list[ast.stmt], lines: list[str], comments: dict[int, str]) -> dict[str, str]:
    """For each assignment in body: its docstring, else its trailing comment, else the comment
    lines just above it."""
    found: dict[str, str] = {}
    # "Limits: ..." above max_body_bytes speaks for the max_* fields that follow it.
    group: str | None = None
    group_stem = ""
    for index, stmt in enumerate(body):
        previous = body[index - 1] if index else None
        if previous is None or stmt.lineno - previous.end_lineno > 1:
            group = None
        target = getattr(stmt, "target", None) or (getattr(stmt, "targets", None) or [None])[0]
        if not isinstance(target, ast.Name):
            continue
        after = body[index + 1] if index + 1 < len(body) else None
        if (
            isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[target.id] = _clean(after.value.value)
            continue
        if stmt.end_lineno in comments and lines[stmt.end_lineno - 1].strip()[:1] != "#":
            found[target.id] = comments[stmt.end_lineno]
            continue
        above, line = [], stmt.lineno - 1
        while line in comments and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments[line])
            line -= 1
        if above:
            found[target.id] = _clean(" ".join(above))
            # "Limits: ..." above a run of fields speaks for the run; other comments for one.
            group = found[target.id] if LABEL.match(found[target.id]) else None
            group_stem = _stem(target.id)
        elif group and _stem(target.id) == group_stem:
            found[target.id] = group
    return found


def class_notes(cls: type) -> dict[str, str]:
    """{field: what its comment or docstring says} for a class's annotated fields."""
    source = inspect.getsource(cls)
    tree = ast.parse(source)
    return _notes(tree.body[0].body, source.splitlines(), _comments(source))


def module_notes(module: ModuleType) -> dict[str, str]:
    """{constant: its docstring or comment} for a module's top-level assignments."""
    source = Path(module.__file__).read_text()
    return _notes(ast.parse(source).body, source.splitlines(), _comments(source))


def string_constants(path: Path) -> set[str]:
    """Every string literal in a Python file."""
    tree = ast.parse(path.read_text())
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


def get_keys(path: Path, holders: tuple[str, ...]) -> set[str]:
    """Literal keys read as holder.get("key") or holder["key"] for a holder named in holders."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get" and _holder(node.func.value, holders) and node.args:
                found |= _literal(node.args[0])
        elif isinstance(node, ast.Subscript) and _holder(node.value, holders):
            found |= _literal(node.slice)
    return found


def _stem(name: str) -> str:
    return name.split("_")[0]


def _literal(node: ast.expr) -> set[str]:
    return {node.value} if isinstance(node, ast.Constant) and isinstance(node.value, str) else set()


def _holder(node: ast.expr, holders: tuple[str, ...]) -> bool:
    if isinstance(node, ast.BoolOp):  # (extra or {}).get(...)
        return any(_holder(value, holders) for value in node.values)
    return isinstance(node, ast.Name) and node.id in holders
