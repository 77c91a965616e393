"""The P/D proxy: OpenAI-compatible completions, prefilled on one server and decoded on another.

Each request goes to the prefill server with max_tokens=1, stream=false and kv_transfer_params
{"do_remote_decode": true}; then to the decode server with the kv_transfer_params the prefill
server returned, whose answer (streamed or not) goes back to the client. A proxy span starts
or joins the client's W3C trace and is injected into both calls, so one trace spans all three.
"""

import logging
from typing import Any, Final

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import propagate, trace

logger = logging.getLogger(__name__)

SPAN_PROXY: Final = "kvscope.proxy.request"
_TRACER_NAME: Final = "kvscope.harness.proxy"


def create_app(prefill_url: str, decode_url: str, timeout_s: float = 300.0) -> FastAPI:
    """The proxy app; prefill_url and decode_url are the servers' base URLs."""
    app = FastAPI(title="kvscope P/D proxy")
    client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=5.0))
    prefill_url, decode_url = prefill_url.rstrip("/"), decode_url.rstrip("/")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "prefill": prefill_url, "decode": decode_url}

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _disaggregate(client, prefill_url, decode_url, "/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _disaggregate(client, prefill_url, decode_url, "/v1/chat/completions", request)

    @app.on_event("shutdown")
    async def close_client() -> None:
        await client.aclose()

    return app


async def _disaggregate(
    client: httpx.AsyncClient, prefill_url: str, decode_url: str, path: str, request: Request
) -> Response:
    body: dict[str, Any] = await request.json()
    parent = propagate.extract(dict(request.headers))
    span = trace.get_tracer(_TRACER_NAME).start_span(
        SPAN_PROXY, context=parent, kind=trace.SpanKind.SERVER, attributes={"http.route": path}
    )
    headers: dict[str, str] = {}
    propagate.inject(headers, context=trace.set_span_in_context(span, parent))
    try:
        params_or_error = await _prefill(client, prefill_url + path, body, headers)
        if isinstance(params_or_error, Response):
            span.set_status(trace.StatusCode.ERROR, "prefill failed")
            span.end()
            return params_or_error
        decode_body = {**body, "kv_transfer_params": params_or_error}
        if body.get("stream"):
            return StreamingResponse(
                _stream(client, decode_url + path, decode_body, headers, span),
                media_type="text/event-stream",
            )
        answer = await client.post(decode_url + path, json=decode_body, headers=headers)
        span.set_attribute("http.response.status_code", answer.status_code)
        span.end()
        return Response(answer.content, answer.status_code, media_type="application/json")
    except httpx.HTTPError as exc:
        span.record_exception(exc)
        span.end()
        return _error(502, f"a P/D server failed: {type(exc).__name__}: {exc}")


async def _prefill(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> dict[str, Any] | Response:
    """The decode server's kv_transfer_params, or the error response to send the client."""
    prefill_body = {
        **body,
        "max_tokens": 1,
        "stream": False,
        "kv_transfer_params": {"do_remote_decode": True},
    }
    prefill_body.pop("stream_options", None)
    if "max_completion_tokens" in prefill_body:
        prefill_body["max_completion_tokens"] = 1
    answer = await client.post(url, json=prefill_body, headers=headers)
    if answer.status_code != 200:
        return Response(answer.content, answer.status_code, media_type="application/json")
    params = answer.json().get("kv_transfer_params")
    if not isinstance(params, dict):
        return _error(
            502,
            "the prefill server returned no kv_transfer_params: start it with a kv_transfer_config"
            " naming a P/D connector",
        )
    return params


async def _stream(client, url: str, body: dict[str, Any], headers: dict[str, str], span):
    """The decode server's event stream, passed through chunk by chunk; ends the proxy span."""
    try:
        async with client.stream("POST", url, json=body, headers=headers) as answer:
            span.set_attribute("http.response.status_code", answer.status_code)
            async for chunk in answer.aiter_raw():
                yield chunk
    except httpx.HTTPError as exc:
        span.record_exception(exc)
        span.set_status(trace.StatusCode.ERROR, str(exc))
        yield f'data: {{"error": "decode server failed: {type(exc).__name__}"}}\n\n'.encode()
    finally:
        span.end()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "proxy_error"}}, status)


def run(host: str, port: int, prefill_url: str, decode_url: str) -> None:
    """Serve the proxy until interrupted."""
    import uvicorn

    from kvscope.traces.sdk.configure import configure_tracing

    configure_tracing(service_name="kvscope-proxy")  # from OTEL_* and KVSCOPE_* variables
    uvicorn.run(create_app(prefill_url, decode_url), host=host, port=port, log_level="warning")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="kvscope P/D proxy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--prefill-url", required=True)
    parser.add_argument("--decode-url", required=True)
    args = parser.parse_args()
    run(args.host, args.port, args.prefill_url, args.decode_url)
