"""How the Multi makes one answer of its children's answers to a hook vLLM asks it once."""

from typing import Any

from kvscope.connector.multi.children import Child
from kvscope.connector.multi.stats import MultiStats


def reset_cache(results: list[bool | None]) -> bool | None:
    """None when no child has a cache to reset, else whether none refused."""
    return None if all(r is None for r in results) else all(r is not False for r in results)


def handshake_metadata(answers: list[Any]) -> Any:
    """The first child's that has some: vLLM carries one per worker (as its MultiConnector)."""
    return next((metadata for metadata in answers if metadata is not None), None)


def finished_count(counts: list[int | None]) -> int | None:
    """The count every child expects (None when one has none); children that disagree are
    refused, as vLLM's output aggregator takes a single count."""
    if any(count is None for count in counts):
        return None
    if len(set(counts)) > 1:
        raise ValueError(f"children expect different finished counts {sorted(set(counts))}")
    return next(iter(counts), None)


def mem_pool_context(children: list[Child], contexts: list[Any]) -> Any:
    """A child's KV cache memory pool; the KV cache lives in one, so at most one child."""
    pairs = zip(children, contexts, strict=True)
    found = [(child.name, context) for child, context in pairs if context is not None]
    if len(found) > 1:
        raise ValueError(
            f"children {[name for name, _ in found]} each provide a KV cache memory pool; "
            "configure custom_mem_pool on at most one"
        )
    return found[0][1] if found else None


def kv_cache_events(answers: list[Any]) -> Any:
    """The children's KV cache events in one container (the first child's)."""
    merged = None
    for events in answers:
        if events is not None:
            merged = events if merged is None else merged.merge(events)
    return merged


def kv_connector_stats(children: list[Child], answers: list[Any]) -> MultiStats | None:
    """Each child's stats under its name, as vLLM's MultiKVConnectorStats (also on the
    scheduler side, whose stats vLLM adds to the workers')."""
    multi = None
    for child, child_stats in zip(children, answers, strict=True):
        if child_stats is not None:
            multi = multi or MultiStats()
            multi.add(child.name, (child.kv_connector, child.module_path), child_stats)
    return multi
