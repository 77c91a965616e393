"""A circuit breaker per KV tier: one whose loads keep failing is bypassed, then probed again."""

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any

from opentelemetry import trace

from kvscope.traces import names
from kvscope.traces.hook_spans import get_tracer

EXTRA_CONFIG_KEY = "tier_health"
"""The key of a connector's kv_connector_extra_config holding the breaker's settings."""


class TierState(StrEnum):
    HEALTHY = "healthy"  # lookups go to the tier
    BYPASSED = "bypassed"  # lookups answer 0 until the bypass ends
    PROBING = "probing"  # one lookup let through; the others still answer 0


@dataclass(frozen=True)
class TierHealthConfig:
    """When to bypass a tier and for how long. failures_to_bypass=0 turns the breaker off."""

    failures_to_bypass: int = 5  # loads failed or timed out in a row
    bypass_s: float = 2.0  # the first bypass; each failed probe doubles it
    max_bypass_s: float = 30.0
    probe_timeout_s: float = 60.0  # a probe with no load outcome by then lets another through

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, Any] | None) -> "TierHealthConfig":
        """From kv_connector_extra_config: {"tier_health": {"failures_to_bypass": 5, ...}}."""
        settings = (extra or {}).get(EXTRA_CONFIG_KEY) or {}
        if not isinstance(settings, Mapping):
            raise ValueError(f"{EXTRA_CONFIG_KEY} must be a dict of settings, got {settings!r}")
        known = {f.name for f in fields(cls)}
        if unknown := sorted(set(settings) - known):
            raise ValueError(f"unknown {EXTRA_CONFIG_KEY} keys {unknown}; valid: {sorted(known)}")
        config = cls(**settings)
        config.validate()
        return config

    def validate(self) -> None:
        count = self.failures_to_bypass
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise ValueError(
                f"{EXTRA_CONFIG_KEY}.failures_to_bypass must be an integer >= 0 "
                f"(0 turns bypassing off), got {count!r}"
            )
        for name in ("bypass_s", "max_bypass_s", "probe_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(
                    f"{EXTRA_CONFIG_KEY}.{name} must be a positive number of seconds, got {value!r}"
                )
        if self.max_bypass_s < self.bypass_s:
            raise ValueError(
                f"{EXTRA_CONFIG_KEY}.max_bypass_s ({self.max_bypass_s}) must be "
                f">= bypass_s ({self.bypass_s})"
            )


def failure_reason(waited_s: float, timeout_s: float) -> str:
    """A failed load in words, from how long it ran against its timeout (when the copy's own
    error stays on the worker side)."""
    if waited_s >= timeout_s:
        return f"timed out after {waited_s:.2f} s (timeout {timeout_s:g} s)"
    return f"failed after {waited_s:.2f} s"


def emit_state_span(
    tier: str,
    state: TierState,
    reason: str,
    failures: int,
    bypass_s: float,
    engine_id: str | None = None,
):
    """One kvscope.tier.health span, a root of its own (the tier's, not a request's trace),
    naming the engine whose connector judged the tier when it knows it."""
    attributes = {
        names.TIER: tier,
        names.TIER_STATE: str(state),
        names.TIER_REASON: reason,
        names.TIER_FAILURES: failures,
        names.TIER_BYPASS_S: float(bypass_s),
    }
    if engine_id is not None:
        attributes[names.ENGINE_ID] = engine_id
    root = trace.set_span_in_context(trace.INVALID_SPAN)
    get_tracer().start_span(names.SPAN_TIER_HEALTH, context=root, attributes=attributes).end()


class TierHealth:
    """The breaker of one tier. Lookups ask admit(key); load outcomes come back in record().

    A tier (the offload pool, a P2P peer) that fails or times out `failures_to_bypass` loads in a
    row is bypassed for `bypass_s`: its lookups answer 0 at once, so requests recompute instead of
    each waiting out a load timeout. Then one lookup is let through as a probe: its load succeeding
    makes the tier healthy again; failing doubles the bypass, up to `max_bypass_s`. Bypassed lookups
    only mean recompute: greedy tokens stay those of a run without the tier.
    """

    def __init__(
        self,
        tier: str,
        config: TierHealthConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        engine_id: str | None = None,
    ) -> None:
        self.tier = tier
        self.engine_id = engine_id  # vLLM's engine_id of the engine that judges the tier
        self.config = config or TierHealthConfig()
        self.clock = clock
        self.state = TierState.HEALTHY
        self.failures = 0  # loads failed in a row (a success resets it)
        self.bypass_s = self.config.bypass_s  # the current (or next) bypass
        self.bypasses = 0  # times the tier went from healthy or probing to bypassed
        self.bypassed_lookups = 0  # lookups answered 0 because of a bypass
        self.ever_unhealthy = False
        self.bypassed_until = 0.0  # time.monotonic() (the clock) at which the bypass ends
        self._probe: tuple[str, float] | None = None  # (key, admitted at)

    @property
    def enabled(self) -> bool:
        return self.config.failures_to_bypass > 0

    def admit(self, key: str) -> bool:
        """Whether a lookup (of request or transfer `key`) may go to the tier now."""
        if self.state is TierState.HEALTHY:
            return True
        now = self.clock()
        if self.state is TierState.BYPASSED and now >= self.bypassed_until:
            self._probe = (key, now)
            self._change(
                TierState.PROBING,
                f"bypass of {self.bypass_s:g} s over: one lookup let through as a probe",
            )
            return True
        if self.state is TierState.PROBING and self._probe is not None:
            probe_key, since = self._probe
            if key == probe_key:  # the probe asked again (vLLM repeats lookups)
                return True
            if now - since >= self.config.probe_timeout_s:  # it never loaded: another probes
                self._probe = (key, now)
                return True
        self.bypassed_lookups += 1
        return False

    def cancel(self, key: str) -> None:
        """The admitted lookup of `key` will not load (a miss, declined, ended): the next
        lookup may probe instead."""
        if self._probe is not None and self._probe[0] == key:
            self._probe = (key, float("-inf"))  # stale at once: the next lookup takes it over

    def record(self, key: str, ok: bool, reason: str = "load failed") -> None:
        """The outcome of `key`'s load. While bypassed, outcomes of loads admitted earlier
        change nothing; while probing, only the probe's counts."""
        if not self.enabled or self.state is TierState.BYPASSED:
            return
        if self.state is TierState.PROBING:
            if self._probe is None or self._probe[0] != key:
                return
            self._probe = None
            if ok:
                self.failures, self.bypass_s = 0, self.config.bypass_s
                self._change(TierState.HEALTHY, "the probe's load succeeded")
            else:
                self.failures += 1
                self._bypass(
                    min(2 * self.bypass_s, self.config.max_bypass_s),
                    f"the probe's load failed: {reason}",
                )
            return
        if ok:
            self.failures = 0
            return
        self.failures += 1
        if self.failures >= self.config.failures_to_bypass:
            self._bypass(
                self.config.bypass_s, f"{self.failures} loads in a row failed; last: {reason}"
            )

    def counters(self) -> dict[str, int]:
        """Cumulative counts for the connector's stats."""
        return {"tier_bypasses": self.bypasses, "tier_bypassed_lookups": self.bypassed_lookups}

    def gauges(self) -> dict[str, int]:
        """tier_bypassed: 1 while lookups answer 0 (bypassed, or probing with one let through),
        else 0; reported once the tier has been bypassed (until then it is 0 anyway)."""
        if not self.ever_unhealthy:
            return {}
        return {"tier_bypassed": int(self.state is not TierState.HEALTHY)}

    def _bypass(self, bypass_s: float, reason: str) -> None:
        self.bypass_s, self.bypassed_until = bypass_s, self.clock() + bypass_s
        self.bypasses += 1
        self.ever_unhealthy = True
        self._change(TierState.BYPASSED, reason)

    def _change(self, state: TierState, reason: str) -> None:
        self.state = state
        bypass_s = 0.0 if state is TierState.HEALTHY else self.bypass_s
        emit_state_span(self.tier, state, reason, self.failures, bypass_s, self.engine_id)
