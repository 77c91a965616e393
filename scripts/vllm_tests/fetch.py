"""Fetches vLLM's own tests: the `tests/` folder of a release's source distribution, found through
pip's configured package index, checked against the index's sha256 and unpacked under a cache.

python scripts/vllm_tests/fetch.py 0.32.0 build/vllm-tests   # prints the unpacked root

The root holds `tests/` only (no `vllm/` beside it, so the installed vLLM is what they import).
"""

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

ACCEPT = "application/vnd.pypi.simple.v1+json"
"""The simple repository API's JSON form (PEP 691)."""


def index_url() -> str:
    """The index pip installs from: PIP_INDEX_URL, pip's configured index-url, or pip's default."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"]
    configured = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if configured.returncode == 0 and configured.stdout.strip():
        return configured.stdout.strip()
    from pip._internal.models.index import PyPI

    return PyPI.simple_url


def sdist_link(version: str, index: str) -> tuple[str, str]:
    """The URL and sha256 of vllm-<version>.tar.gz on `index`."""
    request = urllib.request.Request(f"{index.rstrip('/')}/vllm/", headers={"Accept": ACCEPT})
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    name = f"vllm-{version}.tar.gz"
    for entry in files:
        if entry["filename"] == name:
            return entry["url"], entry["hashes"]["sha256"]
    raise SystemExit(f"{index} lists no {name}")


def fetch(version: str, cache: Path) -> Path:
    """The unpacked root of `version`'s tests, downloaded once into `cache`."""
    root = cache / version
    if (root / "tests" / "conftest.py").is_file():
        return root
    url, sha256 = sdist_link(version, index_url())
    with urllib.request.urlopen(url, timeout=600) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"vllm-{version}.tar.gz does not match the index's sha256")
    prefix = f"vllm-{version}/tests/"
    partial = cache / f"{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
        for member in members:
            member.name = member.name.removeprefix(f"vllm-{version}/")
        archive.extractall(partial, members=members, filter="data")
    partial.rename(root)
    return root


if __name__ == "__main__":
    print(fetch(sys.argv[1], Path(sys.argv[2]).resolve()))
