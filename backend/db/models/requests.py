"""What a request did: its row, its timeline points, its transfers and its failures."""

from sqlalchemy import Index, text
from sqlmodel import Field, SQLModel

from kvscope.backend.db.models.columns import int64_column


class RequestBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    request_id: str | None = None  # found by its number (backend/db/request_numbers.py)
    engine_id: str | None = Field(default=None, index=True)
    connector: str | None = Field(default=None, index=True)
    kv_role: str | None = None
    instance_id: str | None = None
    start_ns: int = int64_column(index=True, nullable=False)
    end_ns: int | None = int64_column()
    status: str = Field(default="running", index=True)
    status_message: str | None = None
    prompt_tokens: int | None = int64_column()


class Request(RequestBase, table=True):
    __tablename__ = "kv_request"
    __table_args__ = (
        # A 'running' stub and its request's final row share this key, which an exporter's
        # retry repeats. Led by the request's number (0 for a row of no request id), a batch's
        # rows land beside each other, and the prompt length of a lookup's request is one
        # probe of it in the hit rates (backend/db/request_numbers.py).
        Index("uq_request_no_span", "request_no", "trace_id", "span_id", unique=True),
        Index("ix_request_end", "end_ns"),
        Index("ix_request_instance_status", "instance_id", "status"),
    )
    id: int | None = Field(default=None, primary_key=True)
    request_no: int | None = int64_column()  # NULL only in rows migration 13 had yet to key


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
    time_ns: int = int64_column(nullable=False)
    value: int | None = int64_column()
    layer: int | None = int64_column()


CACHED_TOKEN_POINTS = "point IN ('vllm_local_cached', 'vllm_external_cached')"
"""vLLM's own cached-token counts among the timeline points (token accounting reads them by
time): the condition of their partial index, which a query must repeat as it is to use it."""


class TimelinePoint(TimelinePointBase, table=True):
    __table_args__ = (
        # Unique keys led by time (backend/db/time_keys.py), which retention deletes by;
        # timelines read by request. Only the kinds read by time have an index by time: an
        # index of every point by kind and time took a tenth of the WAL frames a batch wrote.
        Index("uq_point_time", "time_ns", "trace_id", "span_id", "point", "ordinal", unique=True),
        Index("ix_point_request_no", "request_no"),
        Index(
            "ix_point_cached_time",
            "time_ns",
            sqlite_where=text(CACHED_TOKEN_POINTS),
            postgresql_where=text(CACHED_TOKEN_POINTS),
        ),
    )
    id: int | None = Field(default=None, primary_key=True)
    request_no: int | None = int64_column()


class TimelinePointPublic(TimelinePointBase):
    pass


class RequestNumber(SQLModel, table=True):
    """One number per (engine, request id), given by the writer in the order requests are first
    seen (backend/db/request_numbers.py). Rows without an engine are numbered under ''. Found
    by a 64-bit hash of the request id, the id compared after: an index of 8-byte keys."""

    __tablename__ = "request_number"
    __table_args__ = (Index("ix_request_number_hash", "request_hash"),)
    id: int | None = Field(default=None, primary_key=True)
    request_hash: int | None = int64_column()  # NULL only in rows migration 13 had yet to hash
    request_id: str
    engine_id: str = ""


# --- Transfers ------------------------------------------------------------------------------------


class TransferBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    request_id: str | None = None
    engine_id: str | None = None
    direction: str | None = Field(default=None, index=True)
    peer: str | None = None
    bytes: int | None = int64_column()
    duration_ms: float | None = None
    gbps: float | None = None
    descriptors: int | None = int64_column()
    ok: bool = True
    start_ns: int = int64_column(nullable=False)
    end_ns: int = int64_column(nullable=False)


class Transfer(TransferBase, table=True):
    __table_args__ = (
        Index("uq_transfer_time", "start_ns", "trace_id", "span_id", unique=True),
        Index("ix_transfer_request_no", "request_no"),
    )
    id: int | None = Field(default=None, primary_key=True)
    request_no: int | None = int64_column()


class TransferPublic(TransferBase):
    id: int


# --- Failures -------------------------------------------------------------------------------------


class FailureBase(SQLModel):
    trace_id: str = Field(max_length=32)
    span_id: str = Field(max_length=16)
    ordinal: int = 0
    time_ns: int = int64_column(nullable=False)
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
        Index("uq_failure_time", "time_ns", "trace_id", "span_id", "ordinal", unique=True),
        Index("ix_failure_request_no", "request_no"),
    )
    id: int | None = Field(default=None, primary_key=True)
    request_no: int | None = int64_column()


class FailurePublic(FailureBase):
    id: int
