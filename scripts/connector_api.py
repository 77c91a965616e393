"""Extracts vLLM's KV connector API (members, kinds, parameters) from a vLLM source tree as JSON.

Reads the source only (no import), so any release's Python files will do, e.g. those of a CUDA
wheel unpacked on a machine without a GPU:

    python scripts/connector_api.py /path/to/vllm --version 0.33.0 \\
        --out tests/conformance/vllm_0.33.0_connector_api.json

tests/conformance/test_vllm_api_file.py checks kvscope's wrappers against the file, and that
this extractor reads the installed vLLM as importing it does.
"""

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any, Final

BASE_MODULE: Final = "distributed/kv_transfer/kv_connector/v1/base.py"
"""Where vLLM declares the connector API, relative to the vllm package."""

FACTORY_MODULE: Final = "distributed/kv_transfer/kv_connector/factory.py"
"""Where vLLM registers its stock connectors."""

API_CLASSES: Final = ("KVConnectorBase_V1", "SupportsHMA")
"""The classes whose public members make up the API (traces/forwarding.py's API_CLASSES)."""

KINDS: Final = {"classmethod", "staticmethod", "property"}
"""Decorators that make a member something other than a plain method."""


def parameter_names(arguments: ast.arguments, bound: bool) -> list[str]:
    """As traces.forwarding.parameter_names: '*args', '**kwargs' marked, self or cls left out."""
    names = [a.arg for a in arguments.posonlyargs + arguments.args]
    if arguments.vararg:
        names.append("*" + arguments.vararg.arg)
    names += [a.arg for a in arguments.kwonlyargs]
    if arguments.kwarg:
        names.append("**" + arguments.kwarg.arg)
    return names[1:] if bound else names


def decorator_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    for decorator in function.decorator_list:
        if isinstance(decorator, ast.Name):
            names.add(decorator.id)
        elif isinstance(decorator, ast.Attribute):
            names.add(decorator.attr)  # abc.abstractmethod, name.setter
    return names


def function_member(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    decorators = decorator_names(function)
    kind = next(
        (k for k in ("classmethod", "staticmethod", "property") if k in decorators), "method"
    )
    if kind == "property":
        return {"kind": kind, "params": []}
    return {"kind": kind, "params": parameter_names(function.args, bound=kind != "staticmethod")}


def class_api(class_node: ast.ClassDef) -> dict[str, dict[str, Any]]:
    """The public members a class body declares (a property's setter adds nothing)."""
    members: dict[str, dict[str, Any]] = {}
    for node in class_node.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if not node.name.startswith("_") and node.name not in members:
                members[node.name] = function_member(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and not target.id.startswith("_"):
                    members[target.id] = {"kind": "attribute", "params": []}
    return dict(sorted(members.items()))


def connector_api(vllm_root: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """Each API class's members, read from vllm_root (the vllm package directory)."""
    tree = ast.parse((vllm_root / BASE_MODULE).read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}
    missing = [name for name in API_CLASSES if name not in classes]
    if missing:
        raise SystemExit(f"{vllm_root / BASE_MODULE} declares no {missing}: is it vLLM's package?")
    return {name: class_api(classes[name]) for name in API_CLASSES}


def registered_connectors(vllm_root: Path) -> dict[str, list[str]]:
    """Name -> [module, class] of every register_connector(...) call with literal arguments."""
    tree = ast.parse((vllm_root / FACTORY_MODULE).read_text())
    registered = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "register_connector"
            and len(node.args) == 3
            and all(isinstance(a, ast.Constant) for a in node.args)
        ):
            name, module, class_name = (a.value for a in node.args)
            registered[name] = [module, class_name]
    return dict(sorted(registered.items()))


def api_file(vllm_root: Path, version: str) -> dict[str, Any]:
    return {
        "vllm_version": version,
        "made_by": "scripts/connector_api.py",
        "classes": connector_api(vllm_root),
        "registered_connectors": registered_connectors(vllm_root),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vllm_root", type=Path, help="the vllm package directory")
    parser.add_argument("--version", required=True, help="the vLLM release it is, e.g. 0.33.0")
    parser.add_argument("--out", type=Path, help="file to write (default: standard output)")
    args = parser.parse_args(argv)
    text = json.dumps(api_file(args.vllm_root, args.version), indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
        print(f"wrote {args.out}: vLLM {args.version}'s connector API", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
