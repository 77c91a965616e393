"""Takes the operator guide's dashboard screenshots (docs/images/) in headless Chromium, over a
backend fed the replayed demo recording: `python scripts/docs_screenshots.py`."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
IMAGES = REPO / "docs" / "images"
CHROMIUM = os.environ.get("KVSCOPE_CHROMIUM", "/usr/bin/chromium")
BACKEND_PORT, DASHBOARD_PORT = 14418, 14501
PAGES = (
    ("", "Over time", "overview"),
    ("blocks", "Blocks", "blocks"),
    ("leases", "Age of held leases", "leases"),
    ("requests?request={request}", "Spans and KV timeline points", "requests"),
    ("failures", "Reports folded in", "failures"),
    ("sizing", "Hit rate against pool size", "sizing"),
)
"""(URL path, text shown once the page has drawn, image name) per dashboard page."""


def kvscope(*args: str, env: dict | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "kvscope.cli.main", *args]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def wait_for(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"{url} did not answer within {timeout_s} s")


def loaded_request(backend: str) -> str:
    """The key of a decode-side request whose prompt was read from its prefill peer, for the
    timeline picture (any finished request where the recording has no P2P read)."""
    reads = httpx.get(f"{backend}/api/v1/transport/reads", params={"window_s": 3600}).json()
    reads = reads if isinstance(reads, list) else reads.get("items", [])
    ids = [r["request_id"] for r in reads if r.get("request_id")]
    for request_id in ids[len(ids) // 2 :]:
        found = httpx.get(f"{backend}/api/v1/requests", params={"request_id": request_id}).json()
        decode = [r for r in found["items"] if "decode" in (r.get("engine_id") or "")]
        if decode and decode[0]["status"] != "running":
            return str(decode[0]["id"])
    items = httpx.get(f"{backend}/api/v1/requests", params={"limit": 500}).json()["items"]
    finished = [r for r in items if r["status"] != "running"] or items
    return str(finished[len(finished) // 2]["id"])


def shoot(dashboard: str, backend: str) -> None:
    from playwright.sync_api import sync_playwright

    IMAGES.mkdir(parents=True, exist_ok=True)
    request = loaded_request(backend)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        for path, ready, name in PAGES:
            page.goto(f"{dashboard}/{path.format(request=request)}")
            page.get_by_text(ready, exact=False).first.wait_for()
            time.sleep(3)  # charts draw after their text
            if name == "requests":  # the opened request's timeline, below the list
                page.set_viewport_size({"width": 1400, "height": 1700})
                time.sleep(2)
            target = IMAGES / f"dashboard-{name}.png"
            page.screenshot(path=str(target))
            print(f"wrote {target.relative_to(REPO)}")
            page.set_viewport_size({"width": 1400, "height": 1000})
        browser.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "DATABASE_URL": f"sqlite:///{folder}/kvscope.db"}
        backend_url = f"http://127.0.0.1:{BACKEND_PORT}"
        dashboard_url = f"http://127.0.0.1:{DASHBOARD_PORT}"
        backend = kvscope("backend", "--port", str(BACKEND_PORT), "--grpc-port", "0", env=env)
        dashboard = kvscope(
            "dashboard", "--port", str(DASHBOARD_PORT), "--backend", backend_url, env=env
        )
        try:
            wait_for(f"{backend_url}/health")
            subprocess.run(
                [sys.executable, "-m", "kvscope.cli.main", "replay", "--backend", backend_url],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_for(f"{dashboard_url}/_stcore/health")
            shoot(dashboard_url, backend_url)
        finally:
            for process in (dashboard, backend):
                process.terminate()
                process.wait(timeout=20)


if __name__ == "__main__":
    main()
