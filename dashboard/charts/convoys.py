"""A request's load convoys in words: whose load of the same host blocks it waited for, how long."""

from kvscope.dashboard.charts.recomputes import escaped
from kvscope.traces import names


def convoy_spans(spans: list[dict]) -> list[dict]:
    """The request's waits: its SPAN_REQUEST_EVENT spans that carry a load_convoy point."""
    return [
        span
        for span in spans
        if span.get("name") == names.SPAN_REQUEST_EVENT
        and (span.get("attributes") or {}).get(names.TIMELINE_POINT) == names.LOAD_CONVOY_POINT
    ]


def request_caption(spans: list[dict]) -> str | None:
    """One sentence a wait (the span on the chart is the wait); None when it never waited."""
    sentences = []
    for span in convoy_spans(spans):
        attributes = span.get("attributes") or {}
        wait_ms = (span["end_ns"] - span["start_ns"]) / 1e6
        leader = escaped(str(attributes.get(names.CONVOY_LEADER, "another request")))
        blocks = attributes.get(names.CONVOY_SHARED_BLOCKS)
        what = f"{blocks} host blocks" if blocks else "the same host blocks"
        if attributes.get(names.CONVOY_SHARED_LOAD):
            sentences.append(
                f"Waited {wait_ms:.1f} ms for request {leader}'s load of {what}, then found "
                f"them in vLLM's prefix cache (one load served both)."
            )
        else:
            ahead = attributes.get(names.CONVOY_LOADS_AHEAD) or 1
            sentences.append(
                f"Its load queued {wait_ms:.1f} ms on the copy thread behind request {leader}'s "
                f"load of {what} ({ahead} such load{'s' if ahead > 1 else ''} ahead: a load "
                f"convoy)."
            )
    return " ".join(sentences) or None
