"""Fixtures of the compose tests: .env and docker-compose.yml's services, read once a module."""

import pytest

from tests.demo.compose_files import load_services, read_env_file


@pytest.fixture(scope="module")
def env_file() -> dict[str, str]:
    return read_env_file()


@pytest.fixture(scope="module")
def services(env_file) -> dict[str, dict]:
    """docker-compose.yml's services, with .env substituted."""
    return load_services(env_file)
