"""Span names, event names and attribute keys: each Final constant of traces/names with its
docstring, read with ast as OpenTelemetry's semantic-conventions generator reads its models."""

from pathlib import Path

from docs.gen.code_scan import module_notes
from docs.gen.markdown import code, page, table

MODULES = (
    ("Span names", "spans"),
    ("Span events and timeline points", "events"),
    ("Attributes", "attributes"),
)
"""traces/names' modules, in the order the page shows them."""


def constants(module) -> list[tuple[str, object, str]]:
    """(constant, value, docstring) of each public constant of a module, in source order."""
    notes = module_notes(module)
    order = list(notes) + [name for name in vars(module) if name not in notes]
    return [
        (name, getattr(module, name), notes.get(name, ""))
        for name in order
        if name.isupper() and not name.startswith("_") and hasattr(module, name)
    ]


def sections_of(module) -> list[tuple[str, list]]:
    """The module's `# --- Section ---` comments, each with the constants under it."""
    lines = Path(module.__file__).read_text().splitlines()
    titles: list[tuple[int, str]] = [
        (number, line.strip("# -").strip())
        for number, line in enumerate(lines, 1)
        if line.startswith("# ---")
    ]
    where = {
        line.split(":")[0].strip(): number
        for number, line in enumerate(lines, 1)
        if ": Final" in line and not line.startswith(" ")
    }
    grouped: dict[str, list] = {}
    for item in constants(module):
        line = where.get(item[0], 0)
        title = next((t for n, t in reversed(titles) if n < line), "")
        grouped.setdefault(title, []).append(item)
    return list(grouped.items())


def render() -> str:
    from kvscope.traces import names
    from kvscope.traces.names import attributes, events, spans

    modules = {"spans": spans, "events": events, "attributes": attributes}
    parts = []
    for title, key in MODULES:
        parts.append(f"## {title}\n\nFrom `traces/names/{key}.py`.\n")
        for section, items in sections_of(modules[key]):
            rows = [(code(name), _value(value), doc) for name, value, doc in items]
            heading = f"### {section}\n\n" if section else ""
            parts.append(heading + table(("constant", "value", "meaning"), rows))
    return page(
        "Spans and attributes",
        f"Every span name, event name and attribute key kvscope emits, as `traces/names` defines"
        f" them (schema version {names.SCHEMA_VERSION}, carried as the resource attribute"
        f" `{names.SCHEMA}`; instrumentation scope `{names.INSTRUMENTATION_NAME}`). Code reads"
        " them as `names.X`. Hook spans are named `kvscope.hook.<method>`.",
        *parts,
    )


def _value(value: object) -> str:
    if isinstance(value, tuple):
        return ", ".join(code(v) for v in value)
    return code(value)
