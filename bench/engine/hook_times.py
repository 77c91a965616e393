"""Wall time of every connector hook an engine calls, per arm: the traced wrapper's calls and the
wrapped connector's own, side by side (what a sampling profile cannot give: exact counts, and
the cost of calls far shorter than its interval).

    times = HookTimes(connectors)            # an in-process engine's traced connectors
    with times.around("traced"):
        run_batch()
    times.write(path)                        # per arm and hook: calls and us per batch

Timing wraps the methods of the connectors' classes in this process (the bench's engine worker
is the only user of them there; `restore` puts them back). What tracing adds to a hook is the
traced arm's time minus the untraced arm's; the traced figure also holds its inner call's
timer, about half a microsecond.
"""

import contextlib
import functools
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvscope.bench.engine.tracing_switch import HOOKS

INNER = "inner."
"""Prefix of the wrapped connector's own hooks in the figures."""


class HookTimes:
    """Times each hook of the traced connectors and of the connectors they wrap, per arm."""

    def __init__(self, connectors: list[Any]) -> None:
        self.arm = ""
        self.seconds: Counter[tuple[str, str]] = Counter()
        self.calls: Counter[tuple[str, str]] = Counter()
        self.batches: Counter[str] = Counter()
        # What each patched class held itself before (None: it inherited the method).
        self._saved: dict[tuple[type, str], Any] = {}
        patched: set[type] = set()
        for connector in connectors:
            for cls, prefix in ((type(connector), ""), (type(connector.inner), INNER)):
                if cls not in patched:
                    patched.add(cls)
                    self._patch(cls, prefix)

    def _patch(self, cls: type, prefix: str) -> None:
        for name in HOOKS:
            method = _plain_method(cls, name)
            if method is not None:
                self._saved[cls, name] = vars(cls).get(name)
                setattr(cls, name, self._timed(method, prefix + name))

    def restore(self) -> None:
        """Puts the classes' own methods back (timing stops)."""
        for (cls, name), method in self._saved.items():
            if method is None:
                delattr(cls, name)
            else:
                setattr(cls, name, method)
        self._saved.clear()

    def _timed(self, method, label: str):
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return method(*args, **kwargs)
            finally:
                key = (self.arm, label)
                seconds[key] += clock() - start
                calls[key] += 1

        return timed

    @contextlib.contextmanager
    def around(self, arm: str) -> Iterator[None]:
        self.arm = arm
        try:
            yield
        finally:
            self.batches[arm] += 1
            self.arm = ""

    def per_batch(self) -> dict[str, dict[str, dict[str, float]]]:
        """{arm: {hook: {"calls": per batch, "us": per batch}}}, calls outside batches left out."""
        table: dict[str, dict[str, dict[str, float]]] = {}
        for (arm, label), total in self.seconds.items():
            if not arm:
                continue
            batches = self.batches[arm]
            table.setdefault(arm, {})[label] = {
                "calls": self.calls[arm, label] / batches,
                "us": total * 1e6 / batches,
            }
        return table

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.per_batch(), indent=1, sort_keys=True))


def _plain_method(cls: type, name: str):
    """The function cls's instances call for name, or None for a class or static method."""
    for klass in cls.__mro__:
        if name in vars(klass):
            value = vars(klass)[name]
            return None if isinstance(value, classmethod | staticmethod) else value
    return None


def compare(table: dict, arm: str = "traced", base: str = "untraced") -> str:
    """A Markdown table, costliest first: per hook, calls a batch, the traced arm's time a call,
    the untraced arm's (the wrapped connector called by vLLM itself), and what tracing adds a
    batch. The traced figure holds its inner call's timer, about half a microsecond."""
    traced, untraced = table.get(arm, {}), table.get(base, {})

    def extra(hook: str) -> float:
        bare = untraced.get(INNER + hook) or traced.get(INNER + hook) or {"us": 0.0}
        return traced[hook]["us"] - bare["us"]

    rows = [
        "| hook | calls a batch | traced, us a call | untraced, us a call "
        "| tracing adds, us a batch |",
        "| --- | --- | --- | --- | --- |",
    ]
    hooks = [hook for hook in traced if not hook.startswith(INNER)]
    for hook in sorted(hooks, key=extra, reverse=True):
        outer, bare = traced[hook], untraced.get(INNER + hook)
        bare_text = f"{bare['us'] / (bare['calls'] or 1):.2f}" if bare else "-"
        rows.append(
            f"| {hook} | {outer['calls']:.1f} | {outer['us'] / (outer['calls'] or 1):.2f} "
            f"| {bare_text} | {extra(hook):.0f} |"
        )
    total = sum(extra(hook) for hook in hooks)
    rows.append(f"| all hooks | | | | {total:.0f} |")
    return "\n".join(rows)
