"""Span stream bookkeeping: the processes seen and the seq ranges received from each."""

from sqlalchemy import Index
from sqlmodel import Field, SQLModel

from kvscope.backend.db.models.columns import int64_column, json_text_column


class Process(SQLModel, table=True):
    instance_id: str = Field(primary_key=True)
    service_name: str | None = None
    engine_id: str | None = None
    kv_role: str | None = None
    first_seen_ns: int = int64_column(nullable=False)
    last_seen_ns: int = int64_column(nullable=False)
    telemetry_emitted: int | None = int64_column()
    telemetry_dropped: int | None = int64_column()
    resource: str = json_text_column()


class SeqRange(SQLModel, table=True):
    """A run of consecutive kvscope.seq values received from one process."""

    __table_args__ = (Index("ix_seqrange_instance_lo", "instance_id", "lo"),)
    id: int | None = Field(default=None, primary_key=True)
    instance_id: str
    lo: int = int64_column(nullable=False)
    hi: int = int64_column(nullable=False)
    lo_start_ns: int = int64_column(nullable=False)
    hi_start_ns: int = int64_column(nullable=False)
    seen_ns: int = int64_column(nullable=False)
