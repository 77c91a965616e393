"""The integration tests' backend: one `kvscope backend` process per module, on its own file."""

import pytest

from kvscope.harness.backend_process import BackendProcess


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):
    """A real backend in a subprocess with a fresh SQLite file, stopped after the module."""
    name = request.module.__name__.rsplit(".", 1)[-1]
    process = BackendProcess(tmp_path_factory.mktemp(f"{name}-backend")).start()
    try:
        yield process.wait_ready()
    finally:
        process.stop()
