"""run(): serve the backend with uvicorn, settings from the environment."""

import uvicorn

from kvscope.backend.main import create_app
from kvscope.backend.settings import Settings, check_bind_is_safe, get_settings


def run(
    host: str | None = None,
    port: int | None = None,
    settings: Settings | None = None,
    log_level: str | None = None,
) -> None:
    """Serves until interrupted; host and port default to KVSCOPE_BACKEND_HOST and _PORT."""
    settings = settings or get_settings()
    host = host or settings.host
    port = settings.port if port is None else port
    check_bind_is_safe(settings, host)
    print(
        f"kvscope backend on http://{host}:{port} (OTLP: POST /v1/traces, "
        f"API docs: /docs), database {settings.database_url.split('://')[0]}",
        flush=True,
    )
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_level=log_level or settings.log_level,
        # Exporters post bodies up to the body limit; the header limit stays default.
        timeout_keep_alive=30,
    )
