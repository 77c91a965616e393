"""The state rebuilt from span events: leases and where each block is."""

from sqlalchemy import Index, UniqueConstraint
from sqlmodel import Field, SQLModel

from kvscope.backend.db.models.columns import int64_column


class LeaseBase(SQLModel):
    engine_id: str
    lease_id: str
    holder: str | None = None
    host_block_ids: str = "[]"
    acquired_ns: int | None = int64_column()
    ended_ns: int | None = int64_column()
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


# --- Blocks ---------------------------------------------------------------------------------------


class BlockBase(SQLModel):
    engine_id: str
    tier: str
    address: str
    block_id: int | None = int64_column()
    block_hash: str | None = None
    state: str
    updated_ns: int = int64_column(nullable=False)
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
