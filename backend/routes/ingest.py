"""POST /v1/traces: the OTLP/HTTP trace receiver (protobuf or JSON, optionally compressed)."""

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from kvscope.backend.deps import IngestDep, SettingsDep
from kvscope.backend.ingest.body import JSON, PROTOBUF, BodyError, content_type_of, read_body
from kvscope.backend.ingest.decode import encode_status
from kvscope.backend.ingest.receive import Answer, answer_encoded, refused

router = APIRouter(tags=["ingest"])

TOKEN_HOW = "'Authorization: Bearer <KVSCOPE_BACKEND_TOKEN>'"


def _reply(content_type: str, answer: Answer, headers: dict | None = None) -> Response:
    if answer.status == 200:
        return Response(answer.body, media_type=content_type)
    headers = dict(headers or {})
    if answer.retry_after_s is not None:
        headers["Retry-After"] = str(answer.retry_after_s)
    return Response(
        encode_status(content_type, answer.rpc_code, answer.message),
        status_code=answer.status,
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
        403: {"description": "a web page from a foreign Origin or Host"},
        415: {"description": "wrong type"},
        503: {"description": "busy (database or too many requests at once): retry"},
    },
)
async def export_traces(request: Request, settings: SettingsDep, ingest: IngestDep) -> Response:
    # Errors answer in the request's encoding; anything not protobuf gets readable JSON.
    declared = request.headers.get("content-type", "")
    reply_type = PROTOBUF if declared.startswith(PROTOBUF) else JSON
    if refusal := refused(settings, request.headers.get("authorization"), TOKEN_HOW):
        return _reply(reply_type, refusal, {"WWW-Authenticate": "Bearer"})
    with request.app.state.ingest_gate.admit() as busy:
        if busy is not None:
            return _reply(reply_type, busy)
        try:
            content_type = content_type_of(request)
            body = await read_body(request, settings.max_body_bytes)
        except BodyError as error:
            return _reply(reply_type, Answer(error.status, error.message))
        encoding = request.headers.get("content-encoding", "")
        answer = await run_in_threadpool(
            answer_encoded, ingest, body, encoding, content_type, settings.max_decompressed_bytes
        )
    return _reply(reply_type if answer.status != 200 else content_type, answer)
