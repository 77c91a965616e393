"""The sizing report's answer: per engine, its replays at each size and policy, ceiling, knees."""

from pydantic import BaseModel, Field


class SizingRow(BaseModel):
    policy: str
    factor: float
    pool_blocks: int
    hit_tokens: int
    pool_hit_rate: float = Field(description="hit tokens over the tokens asked of the host pool")
    prefill_tokens_saved: int
    seconds_saved: float | None
    evicted_blocks: int
    in_flight_lookups: int = Field(
        description="lookups that reached a block still being stored: misses, as in the pool"
    )
    in_flight_tokens: int = Field(description="hit tokens those stores in flight cost")
    predicted_ttft_ms_p50: float | None = Field(
        description="each request's measured TTFT adjusted by its replayed hit tokens "
        "(backend/queries/plan/ttft.py); None without measured TTFTs or rates"
    )
    predicted_ttft_ms_p95: float | None


class Ceiling(BaseModel):
    """A pool that never evicts: one block for every block the window asked or stored."""

    pool_blocks: int
    hit_tokens: int
    pool_hit_rate: float
    in_flight_lookups: int
    in_flight_tokens: int
    predicted_ttft_ms_p50: float | None
    predicted_ttft_ms_p95: float | None


class Knee(BaseModel):
    """The smallest pool whose hit tokens are within 1% of the ceiling's, to one size step."""

    policy: str
    pool_blocks: int
    factor: float = Field(description="the knee's size as a multiple of today's pool")
    hit_tokens: int
    pool_hit_rate: float
    predicted_ttft_ms_p50: float | None
    predicted_ttft_ms_p95: float | None


class EngineSizing(BaseModel):
    engine_id: str
    block_size: int
    pool_blocks: int
    lookups: int
    asked_tokens: int
    measured_hit_tokens: int
    recorded_evicted_blocks: int
    recorded_in_flight_lookups: int = Field(
        description="lookups whose first miss the pool recorded as a block still being stored "
        "(compare with the replay's in_flight_lookups at today's size)"
    )
    load_tokens_per_s: float | None
    prefill_tokens_per_s: float | None
    priced_requests: int = Field(description="requests of these lookups with a measured TTFT")
    measured_ttft_ms_p50: float | None
    measured_ttft_ms_p95: float | None
    size_step_blocks: int = Field(description="the knee search's resolution, in blocks")
    ceiling: Ceiling
    knees: list[Knee]
    rows: list[SizingRow]


class SizingPublic(BaseModel):
    window_s: float
    factors: list[float]
    knee_share: float = Field(description="the knee's share of the ceiling's hit tokens")
    engines: list[EngineSizing]
    not_replayable: list[str]  # engines with pool events but no lookup said what it asked
