"""Environment variables: the settings classes' fields and every variable name the code reads."""

import ast
import re
from pathlib import Path

from docs.gen.code_scan import class_notes, string_constants
from docs.gen.config_ref import type_name
from docs.gen.markdown import code, page, table

REPO = Path(__file__).resolve().parents[2]
NAME = re.compile(r"^(KVSCOPE|OTEL)_[A-Z0-9_]*[A-Z0-9]$")
"""A variable kvscope or OpenTelemetry reads (a prefix such as KVSCOPE_BACKEND_ ends in _)."""
SHELL_NAME = re.compile(r"\$\{?(KVSCOPE_[A-Z0-9_]*[A-Z0-9])|\b(KVSCOPE_[A-Z0-9_]*[A-Z0-9])=")
NOT_VARIABLES = {"KVSCOPE_PEER_READY", "KVSCOPE_PEER_REPLY"}
"""Strings shaped like variables that are not (harness/nixl_peer.py's stdout line prefixes)."""

SECTIONS = (
    ("Connectors and tracing (in vLLM's processes)", ("connector", "traces")),
    ("Backend", ("backend",)),
    ("Dashboard", ("dashboard",)),
    ("CLI, demo, verify and harness", ("cli", "demo", "verify", "harness", "model", "deploy")),
    ("Benchmarks", ("bench",)),
)
"""Product folders by who reads their variables."""

MEANINGS = {
    "KVSCOPE_OTLP_ENDPOINTS": "More span destinations, comma-separated: `grpc://host:4317`,"
    " `http://host:4318/v1/traces`, `http+json://...`, `file:///path/spans.jsonl`.",
    "KVSCOPE_TRACES_FILE": "Append spans as OTLP/JSON lines to this file (replayable with"
    " `kvscope replay`).",
    "KVSCOPE_TRACING": "`off` (or `0`, `false`): no spans at all.",
    "KVSCOPE_LAYER_SPANS": "`aggregated` (default): one span per step for the per-layer hooks;"
    " `per_layer`: a span per call.",
    "KVSCOPE_BACKEND_TOKEN": "The backend's bearer token. Connectors send it only to the"
    " destination that is the backend (KVSCOPE_BACKEND_URL / _GRPC_URL); the backend requires it"
    " when set (and to bind beyond loopback); the dashboard sends it.",
    "KVSCOPE_BACKEND_URL": "Where the backend is (`http://host:4318`): the dashboard reads it; a"
    " connector's destination with the same scheme, host and port gets the token.",
    "KVSCOPE_BACKEND_GRPC_URL": "The backend's OTLP/gRPC address (`grpc://host:4317`): that"
    " destination gets the token too.",
    "KVSCOPE_TELEMETRY_INTERVAL_S": "Seconds between `kvscope.telemetry` spans (default 10).",
    "KVSCOPE_P2P_SIDE_CHANNEL_HOST": "P2P `side_channel_host` when the config has none.",
    "KVSCOPE_P2P_SIDE_CHANNEL_PORT": "P2P `side_channel_port` when the config has none.",
    "KVSCOPE_P2P_UCX_LANES": "`0`: do not ask UCX for its protocol tables (the transport lanes"
    " on read spans).",
    "OTEL_SDK_DISABLED": "`true`: no spans at all.",
    "OTEL_SERVICE_NAME": "Service name of the spans (default `kvscope-<kv_role>`).",
    "OTEL_EXPORTER_OTLP_ENDPOINT": "The standard OTLP base endpoint (`/v1/traces` appended for"
    " HTTP).",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "The standard OTLP traces endpoint, as it is.",
    "OTEL_EXPORTER_OTLP_PROTOCOL": "`http/protobuf` (default), `http/json` or `grpc`.",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "The same, for traces only.",
    "OTEL_TRACES_EXPORTER": "`none`: the standard endpoint gets no spans.",
    "OTEL_BSP_MAX_QUEUE_SIZE": "Spans queued per destination before new ones are dropped (4096).",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "Spans per export (512).",
    "OTEL_BSP_SCHEDULE_DELAY": "Milliseconds between exports (500).",
    "OTEL_EXPORTER_OTLP_[TRACES_]HEADERS": "Headers of every OTLP export, gRPC metadata too"
    " (lower-cased): never the backend's token (use KVSCOPE_BACKEND_TOKEN).",
    "OTEL_EXPORTER_OTLP_[TRACES_]COMPRESSION": "`gzip`: compressed OTLP/HTTP bodies.",
    "OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE": "CA file for an `https://` destination.",
    "OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT": "Seconds a batch is retried (429/502/503/504, refused"
    " connections) before it is dropped (10).",
    "DATABASE_URL": "The backend's database: a SQLAlchemy URL, `sqlite:///file.db` or"
    " `postgresql://user:pass@host/db`.",
    "KVSCOPE_BACKEND_HOST": "The address `kvscope backend` binds; beyond loopback it needs a"
    " token of your own.",
    "KVSCOPE_BACKEND_PORT": "The HTTP port: OTLP/HTTP, REST, WebSocket, /metrics.",
    "KVSCOPE_BACKEND_LOG_LEVEL": "uvicorn's and the backend's log level.",
    "KVSCOPE_BACKEND_KV_EVENTS_TOPIC": "The ZMQ topic of the KV-event streams.",
    "KVSCOPE_JAEGER_URL": "Jaeger's UI: the dashboard links each trace there.",
    "KVSCOPE_DASHBOARD_TIMEOUT_S": "Seconds the dashboard waits for one backend answer.",
    "KVSCOPE_BENCH_POSTGRES_URL": "A PostgreSQL server for the benches' `--postgres` default.",
    "KVSCOPE_BENCH_RESULTS": "The JSON-lines file a bench appends its figures to (set by the"
    " report).",
    "KVSCOPE_SOAK_STATE_FILE": "Where the soak's engines write their connectors' state for the"
    " soak to compare.",
    "KVSCOPE_VENV": "The virtual environment `make setup` and the test scripts use (`.venv`).",
    "KVSCOPE_DEVICE": "`cpu` or `cuda`: which vLLM build set-up installs (default: `cuda` when"
    " `nvidia-smi` works).",
    "KVSCOPE_MODEL": "The model folder the Docker image builds and serves.",
    "KVSCOPE_TEST_POSTGRES": "`1`: start a throwaway PostgreSQL for the backend's tests (CI).",
    "KVSCOPE_TEST_POSTGRES_URL": "A PostgreSQL server URL for the backend's tests.",
    "KVSCOPE_TEST_BROWSER": "`1`: install Debian's Chromium for the dashboard's browser tests"
    " (CI).",
    "KVSCOPE_TEST_PROMTOOL": "`1`: install promtool for the alert rules' tests (CI).",
    "KVSCOPE_TEST_WORKERS": "pytest-xdist workers (2; `0`: one process).",
    "KVSCOPE_LANE_VLLM": "The second vLLM release the test lanes run (0.34.0).",
    "KVSCOPE_HANDOFF_BLOCK_SIZES": "Block sizes the CUDA hand-off suites run (comma-separated).",
    "KVSCOPE_CHROMIUM": "The Chromium the browser tests drive (`/usr/bin/chromium`).",
    "KVSCOPE_FUZZ_EXAMPLES": "Examples per fuzz test.",
    "KVSCOPE_FUZZ_RANDOM": "`1`: draw new fuzz examples instead of the fixed seed's.",
    "KVSCOPE_FUZZ_SHRINK": "`0`: report a fuzz failure at once, unshrunk.",
    "KVSCOPE_FUZZ_DATABASE_URL": "Where Hypothesis keeps the fuzz examples it found.",
    "KVSCOPE_VLLM_TESTS_CASES": "Cases per vLLM test file the vLLM-tests lane runs (0: all).",
    "KVSCOPE_VLLM_TESTS_FILES": "vLLM test files the lane runs instead of its list.",
    "KVSCOPE_VLLM_TESTS_WRAPS": "Which wraps the lane runs vLLM's tests under (`traced multi`).",
    "KVSCOPE_VLLM_TESTS_WRAP": "Set by the lane: the wrap of one run.",
    "KVSCOPE_VLLM_TESTS": "Set by the lane: the vLLM release's tests folder.",
}
"""What each variable that no settings class describes means."""

EXPORTER_FAMILY = "OTEL_EXPORTER_OTLP_[TRACES_]{}"
"""traces/sdk/exporters.py reads _env("X") as OTEL_EXPORTER_OTLP_TRACES_X, else _OTLP_X."""


def settings_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(variable, type, default, meaning) per field of a pydantic-settings class."""
    prefix = cls.model_config.get("env_prefix", "")
    notes = class_notes(cls)
    rows = []
    for name, field in cls.model_fields.items():
        variable = field.validation_alias or (prefix + name).upper()
        default = "none" if field.default is None else code(repr(field.default))
        meaning = notes.get(name) or MEANINGS.get(variable, "")
        rows.append((variable, code(type_name(field.annotation)), default, meaning))
    return rows


def exporter_family(path: Path) -> set[str]:
    """OTEL_EXPORTER_OTLP_[TRACES_]X for each _env("X") call."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_env" and node.args:
            found.add(EXPORTER_FAMILY.format(node.args[0].value))
    return found


def read_by(folders: tuple[str, ...]) -> dict[str, set[str]]:
    """{variable: files reading it} over the Python files of these folders."""
    found: dict[str, set[str]] = {}
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            names = {s for s in string_constants(path) if NAME.match(s)} - NOT_VARIABLES
            if path.name == "exporters.py":
                names |= exporter_family(path)
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def setup_and_tests() -> dict[str, set[str]]:
    """Variables of the set-up and test scripts and the tests' Python files."""
    found: dict[str, set[str]] = {}
    shell = [REPO / "Makefile", REPO / ".ci/run", REPO / "Dockerfile"]
    shell += sorted((REPO / "scripts").rglob("*.sh"))
    for path in shell:
        for match in SHELL_NAME.finditer(path.read_text()):
            found.setdefault(match[1] or match[2], set()).add(str(path.relative_to(REPO)))
    for path in [
        *sorted((REPO / "tests").rglob("*.py")),
        *sorted((REPO / "scripts").rglob("*.py")),
    ]:
        for name in string_constants(path):
            if NAME.match(name) and name.startswith("KVSCOPE_"):
                found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def all_variables() -> dict[str, list[tuple[str, str, str, str]]]:
    """{section: rows}, each variable once, in the first section that reads it."""
    from kvscope.backend.settings import Settings
    from kvscope.dashboard.settings import DashboardSettings

    settings = {"Backend": settings_rows(Settings), "Dashboard": settings_rows(DashboardSettings)}
    shown = {row[0] for rows in settings.values() for row in rows}
    sections: dict[str, list] = {}
    for title, folders in SECTIONS:
        rows = [row for row in settings.get(title, []) if row[0] not in sections_names(sections)]
        for name, files in sorted(read_by(folders).items()):
            if name not in shown:
                rows.append((name, "", "", MEANINGS.get(name, "") or _where(files)))
                shown.add(name)
        sections[title] = rows
    rest = [
        (name, "", "", MEANINGS.get(name, "") or _where(files))
        for name, files in sorted(setup_and_tests().items())
        if name not in shown
    ]
    sections["Set-up and tests"] = rest
    return sections


def sections_names(sections: dict[str, list]) -> set[str]:
    return {row[0] for rows in sections.values() for row in rows}


def _where(files: set[str]) -> str:
    return "Read by " + ", ".join(f"`{f}`" for f in sorted(files)[:3]) + "."


def render() -> str:
    parts = [
        f"## {title}\n\n"
        + table(
            ("variable", "type", "default", "meaning"),
            [(code(name), type_, default, meaning) for name, type_, default, meaning in rows],
        )
        for title, rows in all_variables().items()
        if rows
    ]
    return page(
        "Environment variables and settings",
        "Every variable kvscope reads: the backend's and the dashboard's pydantic-settings"
        " fields (`KVSCOPE_BACKEND_<FIELD>`, `KVSCOPE_DASHBOARD_<FIELD>` unless named otherwise),"
        " then each variable name the code, the scripts and the tests read. A variable is listed"
        " once, under the first part that reads it; the type and default are given where a"
        " settings class declares them.",
        *parts,
    )
