"""The backend's REST API: every route and parameter, from FastAPI's app.openapi()."""

from docs.gen.backend_app import backend_app
from docs.gen.markdown import code, page, table

METHODS = ("get", "post", "put", "patch", "delete")


def schema_type(schema: dict) -> str:
    if "anyOf" in schema:
        return " or ".join(schema_type(s) for s in schema["anyOf"] if s.get("type") != "null")
    if "enum" in schema:
        return " \\| ".join(str(v) for v in schema["enum"])
    if schema.get("type") == "array":
        return f"list of {schema_type(schema.get('items', {}))}"
    return schema.get("type") or schema.get("$ref", "").rsplit("/", 1)[-1] or "any"


def _parameter(parameter: dict) -> tuple:
    schema = parameter.get("schema", {})
    default = "required" if parameter.get("required") else code(schema.get("default", ""))
    bounds = [f"{k} {schema[k]}" for k in ("minimum", "maximum") if k in schema]
    if any(abs(schema[k]) > 2**53 for k in ("minimum", "maximum") if k in schema):
        bounds = []
    meaning = parameter.get("description", "")
    if bounds:
        meaning = f"{meaning} ({', '.join(bounds)})".strip()
    return code(parameter["name"]), parameter["in"], schema_type(schema), default, meaning


def _response(operation: dict) -> str:
    ok = operation.get("responses", {}).get("200", {})
    schema = ok.get("content", {}).get("application/json", {}).get("schema", {})
    return schema_type(schema) if schema else ""


def routes(spec: dict) -> list[tuple[str, str, dict]]:
    return [
        (method.upper(), path, operation)
        for path, item in spec["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def websocket_paths(app) -> list[str]:
    return sorted(r.path for r in app.routes if "WebSocket" in type(r).__name__)


def render() -> str:
    with backend_app() as app:
        spec, sockets = app.openapi(), websocket_paths(app)
    index = table(
        ("method", "path", "what"),
        [(method, code(path), op.get("summary", "")) for method, path, op in routes(spec)]
        + [("WebSocket", code(path), "Live updates (see below)") for path in sockets],
    )
    parts = [f"## Routes\n\n{index}"]
    for method, path, operation in routes(spec):
        text = f"### {method} {path}\n\n{operation.get('summary', '')}.\n"
        if description := operation.get("description"):
            text += f"\n{description.strip()}\n"
        if response := _response(operation):
            text += f"\nAnswers `{response}` (JSON).\n"
        if parameters := operation.get("parameters"):
            rows = [_parameter(p) for p in parameters]
            text += "\n" + table(("parameter", "in", "type", "default", "meaning"), rows)
        parts.append(text)
    for path in sockets:
        parts.append(
            f"### WebSocket {path}\n\nPushes finished requests' timelines and ingest batches as"
            " they are stored. Send the token as an `Authorization: Bearer` header or, from a"
            " browser, as the subprotocol `kvscope.bearer.<token in base64url>` beside"
            " `kvscope.v1`.\n"
        )
    return page(
        "REST API",
        f"{spec['info']['title']} {spec['info'].get('version', '')}: every route of the"
        " backend, from its OpenAPI description (a running backend serves the same at `/docs`"
        " and `/openapi.json`). With `KVSCOPE_BACKEND_TOKEN` set, every route but `/health` and"
        " `/metrics` needs `Authorization: Bearer <token>`.",
        *parts,
    )
