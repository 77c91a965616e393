"""SQLModel tables and their public schemas: one family (XBase, X, XPublic) per entity."""

from sqlalchemy import BigInteger, Column, Index, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel


def _ns(index: bool = False, nullable: bool = True):
    """A nanosecond timestamp column: 64-bit on every database."""
    return Field(default=None, sa_type=BigInteger, index=index, nullable=nullable)


def _json_text():
    """A JSON document stored as text: portable across SQLite and PostgreSQL."""
    return Field(default="{}", sa_column=Column(Text, nullable=False))


# --- Spans ------------------------------------------------------------------------------------


class SpanBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    parent_span_id: str | None = Field(default=None, max_length=16)
    name: str
    kind: int = 0
    start_ns: int = _ns(index=True, nullable=False)
    end_ns: int = _ns(nullable=False)
    status_code: int = 0
    status_message: str | None = None
    service_name: str | None = None
    instance_id: str | None = None
    seq: int | None = _ns()
    engine_id: str | None = None
    request_id: str | None = Field(default=None, index=True)


_TIER_HEALTH_SPANS = text("name = 'kvscope.tier.health'")


class Span(SpanBase, table=True):
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_span_trace_span"),
        # Tier state changes are rare spans: a partial index makes the latest per tier a
        # small range read (backend/queries/tiers.py); other spans' inserts only test the name.
        Index(
            "ix_span_tier_health",
            "engine_id",
            "end_ns",
            sqlite_where=_TIER_HEALTH_SPANS,
            postgresql_where=_TIER_HEALTH_SPANS,
        ),
    )
    id: int | None = Field(default=None, primary_key=True)
    attributes: str = _json_text()
    events: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    links: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    received_ns: int = _ns(nullable=False)


class SpanPublic(SpanBase):
    attributes: dict
    events: list
    links: list


# --- Requests and their timeline points -------------------------------------------------------


class RequestBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    request_id: str | None = Field(default=None, index=True)
    engine_id: str | None = Field(default=None, index=True)
    connector: str | None = Field(default=None, index=True)
    kv_role: str | None = None
    instance_id: str | None = None
    start_ns: int = _ns(index=True, nullable=False)
    end_ns: int | None = _ns()
    status: str = Field(default="running", index=True)
    status_message: str | None = None
    prompt_tokens: int | None = _ns()


class Request(RequestBase, table=True):
    __tablename__ = "kv_request"
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_request_span"),
        Index("ix_request_end", "end_ns"),
        # The prompt length of a lookup's request: one probe per lookup in the hit rates.
        Index("ix_request_request_engine", "request_id", "engine_id"),
        Index("ix_request_instance_status", "instance_id", "status"),
    )
    id: int | None = Field(default=None, primary_key=True)


class RequestPublic(RequestBase):
    id: int
    duration_ms: float | None = None


class TimelinePointBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    ordinal: int = 0
    engine_id: str | None = None
    request_id: str | None = None
    point: str
    time_ns: int = _ns(nullable=False)
    value: int | None = _ns()
    layer: int | None = _ns()


class TimelinePoint(TimelinePointBase, table=True):
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", "point", "ordinal", name="uq_point_source"),
        # Retention deletes by time; timelines read by request; series sum one point kind.
        Index("ix_point_time", "time_ns"),
        Index("ix_point_request", "request_id", "engine_id"),
        Index("ix_point_kind_time", "point", "time_ns"),
    )
    id: int | None = Field(default=None, primary_key=True)


class TimelinePointPublic(TimelinePointBase):
    pass


# --- Transfers --------------------------------------------------------------------------------


class TransferBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    request_id: str | None = Field(default=None, index=True)
    engine_id: str | None = None
    direction: str | None = Field(default=None, index=True)
    peer: str | None = None
    bytes: int | None = _ns()
    duration_ms: float | None = None
    gbps: float | None = None
    descriptors: int | None = _ns()
    ok: bool = True
    start_ns: int = _ns(index=True, nullable=False)
    end_ns: int = _ns(nullable=False)


class Transfer(TransferBase, table=True):
    __table_args__ = (UniqueConstraint("trace_id", "span_id", name="uq_transfer_span"),)
    id: int | None = Field(default=None, primary_key=True)


class TransferPublic(TransferBase):
    id: int


# --- Failures ---------------------------------------------------------------------------------


class FailureBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    ordinal: int = 0
    time_ns: int = _ns(index=True, nullable=False)
    kind: str = Field(index=True)
    cause: str | None = None
    policy: str | None = None
    outcome: str | None = None
    request_id: str | None = None
    engine_id: str | None = None
    lease_id: str | None = None
    block_ids: str | None = None
    # A MultiConnector's report: the child whose load failed and the one that served instead.
    child: str | None = None
    fallback_child: str | None = None


class Failure(FailureBase, table=True):
    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", "ordinal", name="uq_failure_source"),
        Index("ix_failure_request", "request_id", "engine_id"),
    )
    id: int | None = Field(default=None, primary_key=True)


class FailurePublic(FailureBase):
    id: int


# --- Lookups and vLLM's latencies: the columns the summary and series aggregate in SQL -----


class Lookup(SQLModel, table=True):
    """One decided external-cache lookup (a get_num_new_matched_tokens span)."""

    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_lookup_span"),
        Index("ix_lookup_time", "time_ns"),
        Index("ix_lookup_request", "request_id", "engine_id"),
    )
    id: int | None = Field(default=None, primary_key=True)
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    engine_id: str | None = None
    request_id: str | None = None
    connector: str | None = None
    child: str | None = None
    time_ns: int = _ns(nullable=False)
    hit_tokens: int = _ns(nullable=False)


class Latency(SQLModel, table=True):
    """vLLM's llm_request timings of one request (its API server's request id)."""

    __table_args__ = (
        UniqueConstraint("trace_id", "span_id", name="uq_latency_span"),
        Index("ix_latency_time", "time_ns"),
        Index("ix_latency_request", "request_id"),
    )
    id: int | None = Field(default=None, primary_key=True)
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    request_id: str | None = None
    time_ns: int = _ns(nullable=False)
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
    bucket_ns: int = _ns(nullable=False)
    engine_id: str = ""
    label: str = ""
    samples: int = Field(default=0, sa_type=BigInteger)
    positives: int = Field(default=0, sa_type=BigInteger)
    total: int = Field(default=0, sa_type=BigInteger)
    extra: int = Field(default=0, sa_type=BigInteger)


# --- Leases -----------------------------------------------------------------------------------


class LeaseBase(SQLModel):
    engine_id: str
    lease_id: str
    holder: str | None = None
    host_block_ids: str = "[]"
    acquired_ns: int | None = _ns()
    ended_ns: int | None = _ns()
    outcome: str | None = None
    timeout_s: float | None = None
    instance_id: str | None = None


class Lease(LeaseBase, table=True):
    __table_args__ = (
        UniqueConstraint("engine_id", "lease_id", name="uq_lease"),
        # Held leases oldest first (ended_ns IS NULL), retention, and an engine's leases.
        Index("ix_lease_ended_acquired", "ended_ns", "acquired_ns"),
        Index("ix_lease_instance", "instance_id", "ended_ns"),
    )
    id: int | None = Field(default=None, primary_key=True)


class LeasePublic(LeaseBase):
    active: bool
    age_s: float | None
    expires_ns: int | None
    overdue: bool
    certain: bool
    uncertain_reason: str | None = None


# --- Blocks -----------------------------------------------------------------------------------


class BlockBase(SQLModel):
    engine_id: str
    tier: str
    address: str
    block_id: int | None = _ns()
    block_hash: str | None = None
    state: str
    updated_ns: int = _ns(nullable=False)
    instance_id: str | None = None
    request_id: str | None = None
    # vLLM's KV cache group (hybrid KV cache manager); NULL (rows before migration 5) = 0.
    kv_group: int | None = None


class Block(BlockBase, table=True):
    __table_args__ = (
        UniqueConstraint("engine_id", "tier", "address", name="uq_block_address"),
        Index("ix_block_updated", "updated_ns"),
        Index("ix_block_state_updated", "state", "updated_ns"),
    )
    id: int | None = Field(default=None, primary_key=True)


class BlockPublic(BlockBase):
    lease_id: str | None = None
    loading: bool = False
    certain: bool = True
    uncertain_reason: str | None = None


# --- Span stream bookkeeping: processes and the seq ranges received from each -----------------


class Process(SQLModel, table=True):
    instance_id: str = Field(primary_key=True)
    service_name: str | None = None
    engine_id: str | None = None
    kv_role: str | None = None
    first_seen_ns: int = _ns(nullable=False)
    last_seen_ns: int = _ns(nullable=False)
    telemetry_emitted: int | None = _ns()
    telemetry_dropped: int | None = _ns()
    resource: str = _json_text()


class SeqRange(SQLModel, table=True):
    """A run of consecutive kvscope.seq values received from one process."""

    __table_args__ = (Index("ix_seqrange_instance_lo", "instance_id", "lo"),)
    id: int | None = Field(default=None, primary_key=True)
    instance_id: str
    lo: int = _ns(nullable=False)
    hi: int = _ns(nullable=False)
    lo_start_ns: int = _ns(nullable=False)
    hi_start_ns: int = _ns(nullable=False)
    seen_ns: int = _ns(nullable=False)
