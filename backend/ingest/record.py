"""The span record (and a request's decoded batch) every later stage takes; clean() for text."""

from dataclasses import dataclass, field

from kvscope.backend.ingest import text

# service.name comes from OTel's resource semantic conventions, not from kvscope's names.
SERVICE_NAME = "service.name"


@dataclass(slots=True)
class SpanRecord:
    """One span, decoded and checked, with the process facts its resource carries."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    status_message: str | None
    attributes: dict
    events: list
    links: list
    instance_id: str | None
    service_name: str | None
    engine_id: str | None


@dataclass(slots=True)
class Decoded:
    """What one export request held: accepted spans, rejections and warnings."""

    spans: list[SpanRecord] = field(default_factory=list)
    resources: dict[str, dict] = field(default_factory=dict)
    rejected: int = 0
    message: str | None = None


def clean(value: str) -> str:
    """Text safe for every database: PostgreSQL refuses NUL characters in text columns."""
    return text.safe(value)
