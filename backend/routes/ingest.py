"""POST /v1/traces: the OTLP/HTTP trace receiver (protobuf or JSON, optionally compressed)."""

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from kvscope.backend.body import BodyError, content_type_of, read_body
from kvscope.backend.deps import IngestDep, SettingsDep, token_matches
from kvscope.backend.otlp import JSON, PROTOBUF, PayloadError, encode_response, encode_status
from kvscope.backend.writer import StoreUnavailable

router = APIRouter(tags=["ingest"])

# google.rpc.Code numbers for the Status body OTLP/HTTP sends with an error.
_RPC_CODES = {400: 3, 401: 16, 413: 8, 415: 3, 503: 14}


def _error(content_type: str, status: int, message: str, headers=None) -> Response:
    return Response(
        encode_status(content_type, _RPC_CODES.get(status, 2), message),
        status_code=status,
        media_type=content_type,
        headers=headers,
    )


@router.post(
    "/v1/traces",
    summary="Receive spans (OTLP/HTTP, ExportTraceServiceRequest)",
    responses={
        400: {"description": "malformed body"},
        401: {"description": "bad token"},
        413: {"description": "body too large"},
        415: {"description": "wrong type"},
        503: {"description": "database busy: retry"},
    },
)
async def export_traces(request: Request, settings: SettingsDep, ingest: IngestDep) -> Response:
    # Errors answer in the request's encoding; anything not protobuf gets readable JSON.
    declared = request.headers.get("content-type", "")
    reply_type = PROTOBUF if declared.startswith(PROTOBUF) else JSON
    if not token_matches(settings, request.headers.get("authorization")):
        return _error(
            reply_type,
            401,
            "missing or wrong bearer token: send 'Authorization: Bearer <KVSCOPE_BACKEND_TOKEN>'",
            {"WWW-Authenticate": "Bearer"},
        )
    try:
        content_type = content_type_of(request)
        body = await read_body(request, settings.max_body_bytes, settings.max_decompressed_bytes)
        stored = await run_in_threadpool(ingest.ingest, body, content_type)
    except BodyError as error:
        return _error(reply_type, error.status, error.message)
    except PayloadError as error:
        return _error(reply_type, 400, str(error))
    except StoreUnavailable as error:
        # 503 with Retry-After is what OTLP exporters retry on: the batch is not lost.
        return _error(reply_type, 503, str(error), {"Retry-After": "1"})
    if stored.rejected and not stored.spans:
        return _error(content_type, 400, f"all {stored.rejected} spans rejected: {stored.message}")
    return Response(
        encode_response(content_type, stored.rejected, stored.message), media_type=content_type
    )
