"""Backend settings, read once from the environment (pydantic-settings singleton)."""

import hmac
import os
from functools import lru_cache
from ipaddress import ip_address

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///kvscope.db"


class Settings(BaseSettings):
    """Every knob of the backend; env names are KVSCOPE_BACKEND_<FIELD> unless aliased."""

    model_config = SettingsConfigDict(env_prefix="KVSCOPE_BACKEND_", populate_by_name=True)

    database_url: str = Field(DEFAULT_DATABASE_URL, validation_alias="DATABASE_URL")
    token: str | None = None
    # Browsers: Origins allowed besides the backend's own (comma-separated; '*': any), and
    # Host names a tokenless backend answers besides loopback ones (DNS rebinding).
    allowed_origins: str = "http://localhost:8501,http://127.0.0.1:8501"
    allowed_hosts: str = ""
    host: str = "127.0.0.1"
    port: int = 4318
    # OTLP/gRPC receiver on the same host (`kvscope backend` only); 0: none.
    grpc_port: int = Field(4317, ge=0, le=65535)
    # Limits: a bounded body, bounded decompression and bounded attributes per span.
    max_body_bytes: int = 16 * 1024 * 1024
    max_decompressed_bytes: int = 64 * 1024 * 1024
    max_attribute_value_bytes: int = 8 * 1024
    max_attribute_array_len: int = 1024
    max_attributes_per_span: int = 128
    max_events_per_span: int = 1024
    # Export requests read, decoded or stored at once (HTTP and gRPC together); beyond it
    # 503 with Retry-After (gRPC UNAVAILABLE), which exporters retry.
    max_concurrent_ingest: int = Field(8, ge=1)
    # Retention: whichever limit is reached first prunes the oldest spans.
    retention_max_spans: int = 5_000_000
    retention_max_age_s: float = 7 * 24 * 3600.0
    retention_interval_s: float = 10.0
    # A seq hole younger than this may be spans still open or in flight, not lost ones.
    gap_grace_s: float = 30.0
    # A request's miss reasons are counted in /metrics this long after it ended (its workers'
    # failure reports come in other batches).
    miss_metrics_settle_s: float = Field(30.0, ge=0)
    # A process that reported telemetry and then was silent this long is gone ('engine lost'):
    # three of its 10 s telemetry intervals.
    engine_lost_after_s: float = Field(30.0, gt=0)
    # Finished requests whose timelines are pushed on the WebSocket per ingest batch.
    ws_max_timelines_per_batch: int = 50
    log_level: str = "info"
    # Worker processes that decode batches (Python work runs on one core per
    # process); None: one per core, at most 4, and none on a single core; 0: in the server.
    ingest_workers: int | None = Field(None, ge=0, le=64)
    # SQLite: batches that queued for the writer share one transaction (off: one each).
    group_commit: bool = True
    # vLLM KV-event streams to subscribe to ([ENGINE_ID=]tcp://HOST:PORT, comma-separated;
    # empty: none), compared with the spans at /api/v1/kv-events/divergence.
    kv_events: str = Field("", validation_alias="KVSCOPE_KV_EVENTS")
    kv_events_topic: str = "kv-events"
    # Overrides of the expected and line rate of P2P transports, JSON {"tcp": [1.0, 25.0], ...}
    # in GB/s (defaults and families: backend/queries/transport_rates.py).
    transport_rates: str = ""

    def resolved_ingest_workers(self) -> int:
        if self.ingest_workers is not None:
            return self.ingest_workers
        cores = len(os.sched_getaffinity(0))
        return 0 if cores < 2 else min(cores, 4)


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings; tests build their own Settings and pass them to create_app."""
    return Settings()


def is_loopback(host: str) -> bool:
    """True when binding to host is reachable only from this machine."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


PLACEHOLDER_TOKENS = frozenset(("change-me", "changeme", "change_me"))
"""Tokens shipped as examples (.env): anyone who read the repository knows them."""


def has_real_token(settings: Settings) -> bool:
    """A token is set and is not a published placeholder."""
    token = settings.token
    return bool(token and token.strip().lower() not in PLACEHOLDER_TOKENS)


def bind_refusal(settings: Settings, host: str) -> str | None:
    """Why listening on host is unsafe (beyond loopback without a real token), or None."""
    if is_loopback(host) or has_real_token(settings):
        return None
    what = "the placeholder token" if settings.token else "no token"
    return (
        f"refusing to serve the kvscope backend on {host!r} with {what}: set "
        "KVSCOPE_BACKEND_TOKEN to a secret of your own (e.g. `openssl rand -hex 16`; clients "
        "send 'Authorization: Bearer <token>') or bind to 127.0.0.1"
    )


def check_bind_is_safe(settings: Settings, host: str) -> None:
    """Refuse to listen beyond loopback without a real token: spans reveal prompts' structure."""
    if refusal := bind_refusal(settings, host):
        raise SystemExit(refusal)


def token_matches(settings: Settings, authorization: str | None) -> bool:
    """True when no token is configured or the header carries it ('Bearer <token>')."""
    if not settings.token:
        return True
    scheme, _, presented = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode(), settings.token.encode()
    )
