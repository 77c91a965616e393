"""GET /metrics: the backend's own Prometheus metrics (open, like vLLM's /metrics and /health)."""

from fastapi import APIRouter, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kvscope.backend.deps import IngestDep

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    summary="Prometheus metrics: spans received, stored, dropped, gaps",
    response_class=PlainTextResponse,  # the spec then says text/plain, Prometheus' format
)
def metrics(ingest: IngestDep) -> Response:
    return Response(generate_latest(ingest.metrics.registry), media_type=CONTENT_TYPE_LATEST)
