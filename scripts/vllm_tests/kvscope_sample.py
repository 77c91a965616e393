"""A pytest plugin for vLLM's own tests in CI: every test function runs, each with its first
KVSCOPE_VLLM_TESTS_CASES parametrizations in collection order (unset or 0: all of them), so the
bare and wrapped runs cover every function at a fraction of the parametrized product. Loaded
with `-p kvscope_sample`.
"""

import os
from collections import Counter
from typing import Any


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    cases = int(os.environ.get("KVSCOPE_VLLM_TESTS_CASES") or 0)
    if cases <= 0:
        return
    seen: Counter[tuple[str, str]] = Counter()
    kept, dropped = [], []
    for item in items:
        function = (item.nodeid.split("[", 1)[0], getattr(item, "originalname", item.name))
        seen[function] += 1
        (kept if seen[function] <= cases else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
