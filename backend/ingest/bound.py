"""Per-span checks: ids and times that make a span unusable, sizes that get truncated."""

from collections import Counter
from dataclasses import dataclass

TRUNCATED_KEYS = "kvscope.backend.truncated"
"""Attribute the backend adds to a span: keys whose values it cut to fit its limits."""

_ZERO_TRACE = bytes(16)
_ZERO_SPAN = bytes(8)
MAX_NS = 2**63
"""Times are stored as signed 64-bit integers: this and later cannot be."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one span may hold (see Settings for the defaults)."""

    max_attribute_value_bytes: int = 8 * 1024
    max_attribute_array_len: int = 1024
    max_attributes_per_span: int = 128
    max_events_per_span: int = 1024

    @classmethod
    def from_settings(cls, settings) -> "Limits":
        return cls(
            max_attribute_value_bytes=settings.max_attribute_value_bytes,
            max_attribute_array_len=settings.max_attribute_array_len,
            max_attributes_per_span=settings.max_attributes_per_span,
            max_events_per_span=settings.max_events_per_span,
        )


def invalid_reason(
    trace_id: bytes, span_id: bytes, parent_span_id: bytes, name: str, start_ns: int, end_ns: int
) -> str | None:
    """Why a span cannot be stored (ids, name, times), or None when it can."""
    if len(trace_id) != 16 or trace_id == _ZERO_TRACE:
        return "span rejected: traceId must be 16 bytes (32 hex digits), not all zero"
    if len(span_id) != 8 or span_id == _ZERO_SPAN:
        return "span rejected: spanId must be 8 bytes (16 hex digits), not all zero"
    if parent_span_id and len(parent_span_id) != 8:
        return "span rejected: parentSpanId must be empty or 8 bytes"
    if not name:
        return "span rejected: name is empty"
    if end_ns >= MAX_NS:
        return "span rejected: endTimeUnixNano is beyond the year 2262"
    if end_ns < start_ns:
        return "span rejected: endTimeUnixNano is before startTimeUnixNano"
    return None


class SpanChecker:
    """Rejects spans that cannot be stored and trims the ones that are too big."""

    def __init__(self, limits: Limits):
        self.limits = limits
        # A text of at most this many characters has at most the value limit's bytes in UTF-8.
        self._short_text = limits.max_attribute_value_bytes // 4
        self.counts: Counter[str] = Counter()
        self.first_detail: dict[str, str] = {}

    def note(self, problem: str, detail: str = "") -> None:
        # One line per kind of problem keeps the response short for a batch of 10,000 spans.
        self.counts[problem] += 1
        self.first_detail.setdefault(problem, detail)

    def bounded(self, attributes: dict, span_name: str) -> dict:
        """Attributes cut to the limits; cut keys are listed under TRUNCATED_KEYS."""
        limits = self.limits
        short_text = self._short_text
        if len(attributes) <= limits.max_attributes_per_span:
            for value in attributes.values():
                kind = type(value)
                if kind is list or kind is dict or (kind is str and len(value) > short_text):
                    break
            else:
                return attributes  # the usual span: numbers, flags and short texts only
        truncated: list[str] = []
        if len(attributes) > limits.max_attributes_per_span:
            kept = list(attributes)[: limits.max_attributes_per_span]
            truncated.append(f"(+{len(attributes) - len(kept)} attributes dropped)")
            attributes = {key: attributes[key] for key in kept}
        for key, value in attributes.items():
            kind = type(value)
            if not (kind is list or kind is dict or (kind is str and len(value) > short_text)):
                continue  # the usual attribute: a number, a flag or a short text
            bounded_value = self._bounded_value(value)
            if bounded_value is not value:
                attributes[key] = bounded_value
                truncated.append(key)
        if truncated:
            attributes[TRUNCATED_KEYS] = truncated
            self.note(
                f"attributes truncated to the backend's limits "
                f"({limits.max_attribute_value_bytes} bytes per value, "
                f"{limits.max_attribute_array_len} items per list, "
                f"{limits.max_attributes_per_span} per span)",
                f"first on span {span_name!r}: {', '.join(truncated[:3])}",
            )
        return attributes

    def _bounded_value(self, value):
        limit = self.limits.max_attribute_value_bytes
        if isinstance(value, str):
            if len(value) > limit // 4 and len(value.encode()) > limit:
                return value.encode()[:limit].decode(errors="ignore") + "...[truncated]"
            return value
        if isinstance(value, list):
            if len(value) <= self.limits.max_attribute_array_len and all(
                type(item) is int for item in value
            ):
                return value  # block ids, token counts: nothing in them to cut
            items = value[: self.limits.max_attribute_array_len]
            bounded = [self._bounded_value(item) for item in items]
            changed = len(items) < len(value) or any(
                new is not old for new, old in zip(bounded, items, strict=True)
            )
            return bounded if changed else value
        if isinstance(value, dict):
            text = str(value)
            return text[:limit] + "...[truncated]" if len(text) > limit else value
        return value

    def bounded_events(self, span):
        limit = self.limits.max_events_per_span
        if len(span.events) > limit:
            self.note(f"events beyond {limit} per span dropped", f"first on span {span.name!r}")
            return list(span.events)[:limit]
        return span.events

    def summary(self) -> str | None:
        """The problems seen, one clause each, with how many spans had them."""
        if not self.counts:
            return None
        return "; ".join(
            f"{problem}: {count} span(s)"
            + (f", {self.first_detail[problem]}" if self.first_detail[problem] else "")
            for problem, count in self.counts.items()
        )
