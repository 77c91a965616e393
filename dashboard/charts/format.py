"""Human-readable units for the dashboard: bytes, durations, clock times, short ids."""

from datetime import datetime


def human_bytes(count: float | None) -> str:
    if count is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(count) < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


def clock(time_ns: int | None) -> str:
    """Local wall-clock time with milliseconds, the precision spans are read at."""
    if time_ns is None:
        return "–"
    return datetime.fromtimestamp(time_ns / 1e9).strftime("%H:%M:%S.%f")[:-3]


def short_id(value: str | None, width: int = 8) -> str:
    """Engine and process ids are UUIDs: the head is enough to tell them apart on screen."""
    if not value:
        return "–"
    return value if len(value) <= width + 1 else value[:width]


def short_cause(cause: str | None) -> str:
    """'InjectedFault: injected: load 3 ...' -> 'InjectedFault': groups failures by kind."""
    if not cause:
        return "unknown"
    return cause.split(":", 1)[0].strip() or cause


def percent(part: float, whole: float) -> float | None:
    return round(100.0 * part / whole, 1) if whole else None


def engine_name(engine_id: str | None, labels: dict[str, str] | None = None) -> str:
    """'vllm-prefill (kv_producer)' when the backend knows the engine, else its short id."""
    if engine_id and labels and engine_id in labels:
        return labels[engine_id]
    return short_id(engine_id)
