"""The span table: every span received, as it came, with its attributes as JSON text."""

from sqlalchemy import Column, Index, Text, text
from sqlmodel import Field, SQLModel

from kvscope.backend.db.models.columns import int64_column, json_text_column


class SpanBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    parent_span_id: str | None = Field(default=None, max_length=16)
    name: str
    kind: int = 0
    start_ns: int = int64_column(nullable=False)
    end_ns: int = int64_column(nullable=False)
    status_code: int = 0
    status_message: str | None = None
    service_name: str | None = None
    instance_id: str | None = None
    seq: int | None = int64_column()
    engine_id: str | None = None
    request_id: str | None = None


_TIER_HEALTH_SPANS = text("name = 'kvscope.tier.health'")


class Span(SpanBase, table=True):
    __table_args__ = (
        # An exporter's retry is the same span at the same time. The key is led by that time,
        # so OTel's random trace ids do not make every insert random (backend/db/time_keys.py).
        Index("uq_span_time", "start_ns", "trace_id", "span_id", unique=True),
        # Tier state changes are rare spans: a partial index makes the latest per tier a
        # small range read (backend/queries/tiers.py); other spans' inserts only test the name.
        Index(
            "ix_span_tier_health",
            "engine_id",
            "end_ns",
            sqlite_where=_TIER_HEALTH_SPANS,
            postgresql_where=_TIER_HEALTH_SPANS,
        ),
        Index("ix_span_request_no", "request_no"),
    )
    id: int | None = Field(default=None, primary_key=True)
    request_no: int | None = int64_column()
    attributes: str = json_text_column()
    events: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    links: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    received_ns: int = int64_column(nullable=False)


class SpanPublic(SpanBase):
    attributes: dict
    events: list
    links: list
