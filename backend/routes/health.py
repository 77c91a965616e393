"""GET /health: liveness and database reachability, for compose health checks."""

from fastapi import APIRouter, Response, status
from sqlalchemy import text

from kvscope.backend.db.migrations import current_version
from kvscope.backend.deps import IngestDep, SessionDep

router = APIRouter(tags=["health"])


@router.get("/health", summary="Backend and database health")
def health(session: SessionDep, ingest: IngestDep, response: Response) -> dict:
    try:
        session.scalar(text("SELECT 1"))
        version = current_version(session.connection())
    except Exception as error:  # any database failure means unhealthy, with the reason shown
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return {"status": "unhealthy", "database": f"unreachable: {error}"}
    return {
        "status": "ok",
        "database": ingest.engine.dialect.name,
        "schema_version": version,
        "spans_stored_since_start": ingest.spans_stored,
        "ingest_workers": {
            "count": ingest.pool.workers if ingest.pool else 0,
            "ready": ingest.pool.ready if ingest.pool else True,
        },
    }
