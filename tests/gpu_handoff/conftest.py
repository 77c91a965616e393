"""The extensible hand-off fixture: vLLM 0.34's extensible KV cache over host memory, freed after
each test (its views must not outlive it)."""

import pytest


@pytest.fixture
def extensible_handoff(tiny_model):
    """build_extensible_kv_caches over the tiny model; every hand-off it built is freed when the
    test ends (close connectors that use it within the test)."""
    from tests.gpu_handoff.extensible import (
        EXTENSIBLE_KV_CACHE,
        NO_EXTENSIBLE_KV_CACHE,
        build_extensible_kv_caches,
        free_extensible,
    )

    if not EXTENSIBLE_KV_CACHE:
        pytest.skip(NO_EXTENSIBLE_KV_CACHE)
    built = []

    def build(*args, **kwargs):
        handoff = build_extensible_kv_caches(*args, model=tiny_model, **kwargs)
        built.append(handoff)
        return handoff

    yield build
    for handoff in built:
        free_extensible(handoff)
