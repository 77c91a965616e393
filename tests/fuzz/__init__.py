"""Fuzz tests' shared set-up: the backend in-process on SQLite, and how many cases to run.

KVSCOPE_FUZZ_EXAMPLES sets Hypothesis' max_examples per test (the default keeps the fuzz
tests under about a minute and a half on two cores); raise it for a longer hunt, and set
KVSCOPE_FUZZ_SHRINK=0 to see a failure at once instead of waiting for the smallest one. The
cases are the same on every run (CI must not fail on a case an earlier run never tried);
KVSCOPE_FUZZ_RANDOM=1 draws new ones, for a hunt.
"""

import os
from contextlib import contextmanager

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, settings

from kvscope.backend.main import create_app
from kvscope.backend.settings import Settings

EXAMPLES = int(os.environ.get("KVSCOPE_FUZZ_EXAMPLES", "250"))
TIMEOUT_S = 240 + 2 * EXAMPLES
"""pytest-timeout for one fuzz test: generous, as shrinking a failure on a busy machine is slow."""
_SHRINK = os.environ.get("KVSCOPE_FUZZ_SHRINK", "1") != "0"
DERANDOMIZE = os.environ.get("KVSCOPE_FUZZ_RANDOM", "0") != "1"
"""Fixed cases unless KVSCOPE_FUZZ_RANDOM=1."""

FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # neighbours on a shared machine make any per-case deadline flaky
    database=None,  # nothing written into the working tree
    derandomize=DERANDOMIZE,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    phases=list(Phase) if _SHRINK else [p for p in Phase if p is not Phase.shrink],
)
"""Hypothesis settings for every fuzz test: `@FUZZ` under `@given`."""

# Small limits, so that generated spans reach every truncation path.
SMALL_LIMITS = {
    "max_body_bytes": 256 * 1024,
    "max_decompressed_bytes": 1024 * 1024,
    "max_attribute_value_bytes": 512,
    "max_attribute_array_len": 16,
    "max_attributes_per_span": 24,
    "max_events_per_span": 8,
    # Spans dated 1970 are fuzzed too: age-based retention would prune them, by design.
    "retention_max_age_s": float("inf"),
}


@contextmanager
def backend_client(tmp_path, **overrides):
    """A TestClient on a fresh SQLite file (or KVSCOPE_FUZZ_DATABASE_URL); lifespan runs."""
    options = {**SMALL_LIMITS, **overrides}
    database_url = os.environ.get("KVSCOPE_FUZZ_DATABASE_URL", f"sqlite:///{tmp_path}/fuzz.db")
    app = create_app(Settings(database_url=database_url, **options))
    # A loopback base URL: the backend answers only loopback Host names without a token.
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        yield client


def assert_serving(client: TestClient) -> None:
    """The backend still answers and its database is reachable."""
    response = client.get("/health")
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "ok"
