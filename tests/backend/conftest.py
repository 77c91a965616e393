"""Fixtures: a real backend under uvicorn on 127.0.0.1 (SQLite, or PostgreSQL when given)."""

import base64
import os
import threading
import time
import uuid

import httpx
import pytest
import uvicorn
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

from kvscope.backend.main import create_app
from kvscope.backend.settings import Settings

POSTGRES_URL = os.environ.get("KVSCOPE_TEST_POSTGRES_URL")
SKIP_POSTGRES = (
    "KVSCOPE_TEST_POSTGRES_URL is not set: run scripts/postgres.sh and export the "
    "DATABASE_URL it prints as KVSCOPE_TEST_POSTGRES_URL"
)


class RunningBackend:
    """uvicorn serving create_app(settings) in a thread; always stopped by the fixture.
    With grpc, also OTLP/gRPC on 127.0.0.1:settings.grpc_port."""

    def __init__(self, settings: Settings, grpc: bool = False) -> None:
        self.settings = settings
        self.app = create_app(settings, grpc_host="127.0.0.1" if grpc else None)
        config = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="backend", daemon=True)

    def __enter__(self) -> "RunningBackend":
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("backend did not start within 20 s")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def client(self, token: str | None = None) -> httpx.Client:
        token = token if token is not None else self.settings.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, timeout=10, headers=headers)

    def export(self, spans, token: str | None = None, compression=Compression.Gzip):
        """Sends spans with the SDK's own OTLP/HTTP protobuf exporter."""
        token = token if token is not None else self.settings.token
        exporter = OTLPSpanExporter(
            endpoint=f"{self.url}/v1/traces",
            timeout=10,
            compression=compression,
            headers={"Authorization": f"Bearer {token}"} if token else None,
        )
        try:
            return exporter.export(spans)
        finally:
            exporter.shutdown()


def otlp_json(spans) -> dict:
    """The SDK's spans in the OTLP JSON encoding: camelCase keys, ids in hex."""
    document = json_format.MessageToDict(encode_spans(spans))
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                _hex(span, ("traceId", "spanId", "parentSpanId"))
                for link in span.get("links", []):
                    _hex(link, ("traceId", "spanId"))
    return document


def _hex(obj: dict, keys) -> None:
    for key in keys:
        if key in obj:
            obj[key] = base64.b64decode(obj[key]).hex()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database_url(request, tmp_path_factory):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('db')}/kvscope.db"
        return
    if not POSTGRES_URL:
        pytest.skip(SKIP_POSTGRES)
    yield from _throwaway_postgres_database(POSTGRES_URL)


def _throwaway_postgres_database(url: str):
    import psycopg

    name = f"kvscope_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = url.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def backend(database_url):
    # Two ingest worker processes, as on a 2-core server; make_backend stores in-process.
    settings = Settings(database_url=database_url, gap_grace_s=30.0, ingest_workers=2)
    with RunningBackend(settings) as running:
        yield running


@pytest.fixture
def make_backend(database_url):
    """Starts a backend with setting overrides, on a fresh database, for one test."""
    started: list[RunningBackend] = []
    databases = []

    def start(grpc: bool = False, **overrides) -> RunningBackend:
        url = database_url
        if url.startswith("sqlite"):
            url = url.replace("kvscope.db", f"kvscope-{uuid.uuid4().hex[:8]}.db")
        else:
            databases.append(_throwaway_postgres_database(POSTGRES_URL))
            url = next(databases[-1])
        settings = Settings(database_url=url, **{"ingest_workers": 0, **overrides})
        running = RunningBackend(settings, grpc).__enter__()
        started.append(running)
        return running

    yield start
    for running in started:
        running.__exit__(None, None, None)
    for database in databases:
        next(database, None)  # drops it
