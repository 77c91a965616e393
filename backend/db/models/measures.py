"""Lookups, vLLM's latencies and per-second series rollups: the rows the summary adds up."""

from sqlalchemy import BigInteger, Index, UniqueConstraint
from sqlmodel import Field, SQLModel

from kvscope.backend.db.models.columns import int64_column


class Lookup(SQLModel, table=True):
    """One decided external-cache lookup (a get_num_new_matched_tokens span)."""

    __table_args__ = (
        Index("uq_lookup_time", "time_ns", "trace_id", "span_id", unique=True),
        Index("ix_lookup_request_no", "request_no"),
    )
    id: int | None = Field(default=None, primary_key=True)
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    engine_id: str | None = None
    request_id: str | None = None
    connector: str | None = None
    child: str | None = None
    time_ns: int = int64_column(nullable=False)
    hit_tokens: int = int64_column(nullable=False)
    # Tokens vLLM's prefix cache held when the connector was asked (num_computed_tokens).
    local_hit_tokens: int | None = int64_column()
    request_no: int | None = int64_column()  # backend/db/request_numbers.py


class Latency(SQLModel, table=True):
    """vLLM's llm_request timings of one request (its API server's request id)."""

    # Read by time only (the TTFT series): no index by request id.
    __table_args__ = (Index("uq_latency_time", "time_ns", "trace_id", "span_id", unique=True),)
    id: int | None = Field(default=None, primary_key=True)
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    request_id: str | None = None
    time_ns: int = int64_column(nullable=False)
    ttft_ms: float | None = None
    queue_ms: float | None = None


class SeriesRollup(SQLModel, table=True):
    """One second of one series counter (backend/db/rollups.py), kept by triggers at ingest."""

    __tablename__ = "series_rollup"
    __table_args__ = (
        UniqueConstraint("metric", "bucket_ns", "engine_id", "label", name="uq_series_rollup"),
        Index("ix_series_rollup_bucket", "bucket_ns"),
    )
    id: int | None = Field(default=None, primary_key=True)
    metric: str
    bucket_ns: int = int64_column(nullable=False)
    engine_id: str = ""
    label: str = ""
    samples: int = Field(default=0, sa_type=BigInteger)
    positives: int = Field(default=0, sa_type=BigInteger)
    total: int = Field(default=0, sa_type=BigInteger)
    extra: int = Field(default=0, sa_type=BigInteger)
