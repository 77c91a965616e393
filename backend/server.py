"""run(): serve the backend with uvicorn, settings from the environment."""

import uvicorn

from kvscope.backend.main import create_app
from kvscope.backend.settings import Settings, check_bind_is_safe, get_settings


def run(
    host: str | None = None,
    port: int | None = None,
    settings: Settings | None = None,
    log_level: str | None = None,
    grpc_port: int | None = None,
) -> None:
    """Serves until interrupted; host and ports default to KVSCOPE_BACKEND_HOST, _PORT and
    _GRPC_PORT (OTLP/gRPC on the same host; 0: none)."""
    settings = settings or get_settings()
    if grpc_port is not None:
        settings = settings.model_copy(update={"grpc_port": grpc_port})
    host = host or settings.host
    port = settings.port if port is None else port
    settings = settings.model_copy(update={"host": host})
    check_bind_is_safe(settings, host)  # create_app checks again; this fails before any print
    grpc = f", OTLP/gRPC on {host}:{settings.grpc_port}" if settings.grpc_port else ""
    print(
        f"kvscope backend on http://{host}:{port} (OTLP: POST /v1/traces, "
        f"API docs: /docs){grpc}, database {settings.database_url.split('://')[0]}",
        flush=True,
    )
    uvicorn.run(
        create_app(settings, grpc_host=host),
        host=host,
        port=port,
        log_level=log_level or settings.log_level,
        # Exporters post bodies up to the body limit; the header limit stays default.
        timeout_keep_alive=30,
    )
