"""The reference pages are what the code renders now, and every name the code has is on them."""

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from docs.gen import env_ref  # noqa: E402
from docs.gen.backend_app import backend_app  # noqa: E402
from docs.gen.code_scan import get_keys, string_constants  # noqa: E402
from docs.gen.pages import REFERENCE, differing, rendered  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return rendered()


def page(name: str) -> str:
    return (REFERENCE / name).read_text()


def missing(names, text: str) -> list[str]:
    return sorted(n for n in set(names) if f"`{n}`" not in text)


def test_the_committed_pages_are_what_the_code_renders(pages):
    stale = differing(pages)
    assert not stale, f"{stale} differ from the code: run python scripts/docs_reference.py"


def test_every_connector_key_the_code_reads_is_documented():
    from kvscope.connector.child_config import TRANSFER_FIELDS
    from kvscope.connector.common.tier_health import TierHealthConfig
    from kvscope.connector.cpu_offload.config import OffloadConfig
    from kvscope.connector.cpu_offload.faults import FaultPlan
    from kvscope.connector.multi.children import OWN_KEYS
    from kvscope.connector.p2p.config import P2PConfig

    keys = _extra_constants()
    for cls in (OffloadConfig, P2PConfig):
        keys |= {f.name for f in dataclasses.fields(cls) if f.name != "tier_health"}
    keys |= {f"tier_health.{f.name}" for f in dataclasses.fields(TierHealthConfig)}
    keys |= {f"faults.{f.name}" for f in dataclasses.fields(FaultPlan)}
    keys |= {f"connectors[].{name}" for name in TRANSFER_FIELDS | OWN_KEYS}
    assert not missing(keys, page("configuration.md"))


def _extra_constants() -> set[str]:
    """Values of the EXTRA_* constants of connector/ and traces/, and the keys read literally."""
    import ast

    found = set()
    for path in [*(REPO / "connector").rglob("*.py"), *(REPO / "traces").glob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in tree.body:
            targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id.startswith("EXTRA_"):
                    found.add(node.value.value)
        found |= get_keys(path, ("extra", "extra_config"))
    return found


def test_every_environment_variable_is_documented():
    from kvscope.backend.settings import Settings
    from kvscope.dashboard.settings import DashboardSettings

    names = set()
    for folder in ("connector", "traces", "backend", "dashboard", "cli", "demo", "verify", "bench"):
        for path in (REPO / folder).rglob("*.py"):
            names |= {s for s in string_constants(path) if env_ref.NAME.match(s)}
    names -= env_ref.NOT_VARIABLES
    for cls in (Settings, DashboardSettings):
        prefix = cls.model_config["env_prefix"]
        names |= {f.validation_alias or (prefix + n).upper() for n, f in cls.model_fields.items()}
    names |= set(env_ref.setup_and_tests())
    text = page("environment.md")
    assert not missing(names, text)
    undescribed = [line for line in text.splitlines() if line.endswith("|  |")]
    assert not undescribed, f"variables without a meaning: {undescribed}"


def test_every_span_event_and_attribute_name_is_documented():
    from kvscope.traces.names import attributes, events, spans

    values = set()
    for module in (spans, events, attributes):
        for name in dir(module):
            value = getattr(module, name)
            if name.isupper() and isinstance(value, str):
                values.add(value)
    assert not missing(values, page("spans.md"))


def test_every_metric_is_documented():
    import prometheus_client
    from prometheus_client.parser import text_string_to_metric_families

    from docs.gen.metrics_ref import VLLM_LABELS

    text = page("metrics.md")
    with backend_app() as app:
        scraped = prometheus_client.generate_latest(app.state.ingest.metrics.registry).decode()
    families = text_string_to_metric_families(scraped)
    names = {f.name for f in families if not f.name.endswith("_created")}  # a counter's start
    names = {n + "_total" if f"`{n}_total`" in text else n for n in names}
    from kvscope.connector.cpu_offload import prom as offload_prom
    from kvscope.connector.p2p import prom as p2p_prom

    for prom in (offload_prom, p2p_prom):
        names |= {f"{prom.PREFIX}{key}_total" for key in prom.COUNTERS}
        names |= {f"{prom.PREFIX}{key}" for key in prom.GAUGES}
    assert VLLM_LABELS == ("model_name", "engine")
    assert not missing(names, text)


def test_every_rest_route_is_documented():
    with backend_app() as app:
        own = {app.docs_url, app.redoc_url, app.openapi_url, app.swagger_ui_oauth2_redirect_url}
        paths = {getattr(route, "path", "") for route in app.routes} - own
    text = page("rest-api.md")
    assert not missing(paths, text)


def test_every_cli_subcommand_and_flag_is_documented():
    import argparse

    from kvscope.cli.main import build_parser

    text = page("cli.md")

    def walk(parser: argparse.ArgumentParser, prefix: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield f"{prefix} {name}", None
                    yield from walk(sub, f"{prefix} {name}")
            elif not isinstance(action, argparse._HelpAction):
                yield prefix, ", ".join(action.option_strings) or action.dest

    absent = []
    for command, flag in walk(build_parser(), "kvscope"):
        section = text.split(f"\n## {command}\n", 1)
        if len(section) < 2:
            absent.append(command)
        elif flag and f"`{flag}`" not in section[1].split("\n## ", 1)[0]:
            absent.append(f"{command} {flag}")
    assert not absent
