"""API response shapes that are not tables: pages, timelines, stream health, summaries."""

from typing import Generic, TypeVar

from pydantic import BaseModel

from kvscope.backend.db.models import (
    BlockPublic,
    FailurePublic,
    LeasePublic,
    RequestPublic,
    TimelinePointPublic,
    TransferPublic,
)

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    offset: int
    limit: int


class GapPublic(BaseModel):
    """Seq numbers not received from one process; 'pending' may still arrive."""

    origin: str
    first: int
    last: int
    count: int
    after_ns: int | None
    before_ns: int
    age_s: float
    state: str


class StreamPublic(BaseModel):
    """How complete the span stream of one process is."""

    origin: str
    service_name: str | None
    engine_id: str | None
    received: int
    highest_seq: int
    holes: list[GapPublic]
    telemetry_emitted: int | None
    telemetry_dropped: int | None
    status: str


class Certainty(BaseModel):
    """Why state derived from a process may be stale: lost or not yet received spans."""

    complete: bool
    gaps: list[GapPublic]


class BlocksPage(Page[BlockPublic]):
    certainty: Certainty


class LeasesPage(Page[LeasePublic]):
    certainty: Certainty


class TtftBreakdown(BaseModel):
    """Time to first token split into queue, lookup, waiting for KV and compute (ms)."""

    ttft_ms: float | None = None
    queue_ms: float | None = None
    lookup_ms: float | None = None
    kv_wait_ms: float | None = None
    compute_ms: float | None = None
    sources: dict[str, str] = {}


class Timeline(BaseModel):
    request: RequestPublic
    points: list[TimelinePointPublic]
    first: dict[str, int]
    missing_points: list[str]
    ttft: TtftBreakdown
    transfers: list[TransferPublic]
    failures: list[FailurePublic]
    certainty: Certainty


class Summary(BaseModel):
    window_s: float
    since_ns: int
    requests: dict[str, int]
    ttft_ms_p50: float | None
    ttft_ms_p95: float | None
    external_hit_tokens: int
    transfers: dict[str, dict[str, float]]
    failures: dict[str, int]
    leases_active: int
    blocks: dict[str, dict[str, int]]
    spans: int
    streams_incomplete: int
    tiers_bypassed: int = 0
    """KV tiers (per engine) bypassed or being probed now, whatever the window."""


class HitRate(BaseModel):
    """External cache hits of one connector (and MultiConnector child) over a window."""

    connector: str | None
    child: str | None
    requests: int
    hit_requests: int
    external_hit_tokens: int
    prompt_tokens: int
    hit_rate: float | None = None
    """traces.hit_rate.hit_rate: external hit tokens over prompt tokens, totals of the window."""
