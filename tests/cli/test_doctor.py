"""`kvscope doctor`: correct on this machine, and an actionable message for each missing piece."""

import os
import subprocess
import sys

import pytest


def run_doctor(*args: str, pythonpath: str | None = None, **env: str):
    environment = {**os.environ, **env}
    if pythonpath:
        environment["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [sys.executable, "-m", "kvscope.cli.main", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment,
    )


def shadow_package(root, name: str, message: str) -> str:
    """A package that fails to import, as a broken install does, first on PYTHONPATH."""
    package = root / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"raise ImportError({message!r})\n")
    return str(root)


def test_all_good_with_a_built_model(tiny_model):
    result = run_doctor("--model", str(tiny_model))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[ok  ] vllm: vllm 0.32.0, platform cpu" in result.stdout
    assert "[ok  ] nixl:" in result.stdout and "UCX" in result.stdout
    assert "all good" in result.stdout


def test_missing_model_says_how_to_build_it(tmp_path):
    result = run_doctor("--model", str(tmp_path / "nowhere"))
    assert result.returncode == 1
    assert "[FAIL] tiny model" in result.stdout
    assert f"run: kvscope model build --out {tmp_path / 'nowhere'}" in result.stdout


def test_broken_vllm_is_reported_with_the_fix(tmp_path, tiny_model):
    path = shadow_package(tmp_path, "vllm", "simulated broken vllm install")
    result = run_doctor("--model", str(tiny_model), pythonpath=path)
    assert result.returncode == 1
    assert "[FAIL] vllm: cannot import vllm: simulated broken vllm install" in result.stdout
    assert "-> run scripts/setup.sh" in result.stdout


def test_missing_nixl_is_reported_with_the_install_command(tmp_path, tiny_model):
    path = shadow_package(tmp_path, "nixl_cu12", "No module named 'nixl_cu12'")
    result = run_doctor("--model", str(tiny_model), pythonpath=path)
    assert result.returncode == 1
    assert "[FAIL] nixl: cannot import nixl" in result.stdout
    assert "pip install --no-deps nixl-cu12==1.5.1" in result.stdout


def test_bad_tracing_setting_is_named(tiny_model):
    result = run_doctor("--model", str(tiny_model), KVSCOPE_LAYER_SPANS="sometimes")
    assert result.returncode == 1
    assert "KVSCOPE_LAYER_SPANS='sometimes'" in result.stdout


def test_exporter_destinations_are_listed(tiny_model):
    endpoints = "http://127.0.0.1:4318/v1/traces,grpc://127.0.0.1:4317"
    result = run_doctor("--model", str(tiny_model), KVSCOPE_OTLP_ENDPOINTS=endpoints)
    assert "exporting to http/protobuf http://127.0.0.1:4318/v1/traces" in result.stdout
    assert "grpc http://127.0.0.1:4317" in result.stdout


@pytest.mark.parametrize(
    ("version", "ok", "says"),
    [
        ("0.34.0", True, "verified by its scheduler"),
        ("0.33.1", True, "verified by its connector API"),
        ("0.35.0", False, "supports vLLM 0.32, 0.33, 0.34"),
    ],
)
def test_each_supported_release_says_what_verifies_it(monkeypatch, version, ok, says):
    import vllm

    from kvscope.cli.doctor import check_vllm

    monkeypatch.setattr(vllm, "__version__", version)
    check = check_vllm()
    assert check.ok is ok
    assert says in (check.detail if ok else check.fix)
