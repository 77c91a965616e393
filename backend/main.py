"""The FastAPI application: bind check, database set-up, routers, the ingest service, live hub
and the browser guard."""

import asyncio
from contextlib import asynccontextmanager

from fastapi import FastAPI

from kvscope.backend import logs
from kvscope.backend.db.bulk import add_postgres_stages
from kvscope.backend.db.database import make_engine
from kvscope.backend.db.migrations import migrate
from kvscope.backend.guard import BrowserGuard
from kvscope.backend.ingest.pipeline import Pipeline
from kvscope.backend.ingest.receive import IngestGate
from kvscope.backend.ingest.receive_grpc import start_receiver
from kvscope.backend.ingest.write import STAGED_TABLES
from kvscope.backend.kv_events import service as kv_events_service
from kvscope.backend.kv_events.metrics import KVEventsCollector
from kvscope.backend.live import Hub
from kvscope.backend.metrics import AccountingCollector, RecomputeCollector, StreamCollector
from kvscope.backend.miss_metrics import MissCollector
from kvscope.backend.routes import (
    accounting,
    blocks,
    clocks,
    convoys,
    failures,
    health,
    ingest,
    kv_events,
    leases,
    metrics,
    misses,
    plan,
    recomputes,
    requests,
    stats,
    streams,
    tiers,
    transfers,
    transport,
    ws,
)
from kvscope.backend.settings import Settings, check_bind_is_safe, get_settings

ROUTERS = (
    health,
    metrics,
    ingest,
    requests,
    blocks,
    leases,
    failures,
    transfers,
    stats,
    streams,
    ws,
    tiers,
    clocks,
    recomputes,
    kv_events,
    accounting,
    plan,
    misses,
    transport,
    convoys,
)


def create_app(settings: Settings | None = None, grpc_host: str | None = None) -> FastAPI:
    """The app; with grpc_host, its lifespan also serves OTLP/gRPC on grpc_host:grpc_port.
    `uvicorn --factory kvscope.backend.main:create_app` works too: the bind check runs here
    (KVSCOPE_BACKEND_HOST), and the guard refuses tokenless requests from beyond loopback
    whatever address uvicorn was told to bind."""
    settings = settings or get_settings()
    check_bind_is_safe(settings, settings.host)
    if grpc_host is not None and settings.grpc_port:
        check_bind_is_safe(settings, grpc_host)
    logs.install()
    engine = make_engine(settings.database_url)
    add_postgres_stages(engine, STAGED_TABLES)
    migrate(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.hub.bind(asyncio.get_running_loop())
        app.state.ingest.warm_up()
        receiver = None
        if grpc_host is not None and settings.grpc_port:
            receiver = start_receiver(app.state.ingest, settings, grpc_host, app.state.ingest_gate)
        app.state.grpc_port = receiver.port if receiver else None
        kv_events_service.start(app, settings)
        yield
        kv_events_service.stop(app)
        if receiver is not None:  # before ingest closes: calls in progress still store
            receiver.stop()
        app.state.ingest.close()
        engine.dispose()

    app = FastAPI(
        title="kvscope backend",
        summary="OTLP receiver and API for vLLM KV connector timelines, blocks and leases",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.hub = Hub()
    app.state.ingest = Pipeline(engine, settings, app.state.hub, ws.make_publisher(app))
    app.state.ingest.metrics.registry.register(StreamCollector(engine, settings))
    app.state.ingest.metrics.registry.register(RecomputeCollector(engine, failures.incidents_in))
    app.state.ingest.metrics.registry.register(AccountingCollector(engine))
    app.state.ingest.metrics.registry.register(
        MissCollector(engine, settings.miss_metrics_settle_s)
    )
    app.state.kv_events = None
    app.state.ingest.metrics.registry.register(
        KVEventsCollector(engine, lambda: app.state.kv_events)
    )
    app.state.ingest_gate = IngestGate(settings.max_concurrent_ingest)
    for module in ROUTERS:
        app.include_router(module.router)
    app.add_middleware(BrowserGuard, settings=settings)
    return app
