"""The wheel these tests install: built once per run from the checkout, as `pip wheel .` does."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """kvscope's wheel, built without its dependencies (no network, seconds)."""
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("wheel-build")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
        capture_output=True,
        cwd=build,
        env={"PIP_NO_INPUT": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    (found,) = out.glob("kvscope-*.whl")
    return found
