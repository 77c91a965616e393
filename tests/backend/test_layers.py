"""The backend's layers import downward only: db <- ingest (the write path), db <- queries <-
routes (the read path); the write path reads nothing of the read side or the app shell."""

import ast
from pathlib import Path

BACKEND = Path(__file__).parents[2] / "backend"

ALLOWED = {
    "db": {"db"},
    "ingest": {"db", "ingest", "settings"},
    "queries": {"db", "queries"},
    "routes": {"db", "ingest", "queries", "routes", "deps", "settings", "kv_events"},
}
"""What each layer's modules may import of kvscope.backend (settings is the configuration
every part is built from)."""


def backend_imports(path: Path) -> set[str]:
    """The kvscope.backend parts a module imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["kvscope", "backend"] and len(parts) > 2:
                found.add(parts[2])
    return found


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for layer, allowed in ALLOWED.items():
        for path in sorted((BACKEND / layer).rglob("*.py")):
            extra = backend_imports(path) - allowed
            if extra:
                wrong.append(f"{path.relative_to(BACKEND)} imports {sorted(extra)}")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_of_the_read_side(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from kvscope.backend.queries import tiers\n")
    assert backend_imports(module) == {"queries"}
