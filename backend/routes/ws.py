"""GET /ws: a WebSocket that pushes each stored batch's state changes and finished timelines."""

import asyncio
import base64
import logging

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from sqlmodel import Session, select

from kvscope.backend.db.models import Request
from kvscope.backend.ingest.commit import LiveUpdate
from kvscope.backend.queries import certainty
from kvscope.backend.queries.timeline import build
from kvscope.backend.settings import token_matches

router = APIRouter(tags=["live"])
logger = logging.getLogger(__name__)


SUBPROTOCOL = "kvscope.v1"
"""The subprotocol the server answers with; a client offers it beside its token's."""

TOKEN_SUBPROTOCOL = "kvscope.bearer."
"""Prefix of the subprotocol that carries the token (base64url, no padding) for clients that
cannot set headers (browsers): never the URL, which servers and proxies write to their logs."""


def token_subprotocol(token: str) -> str:
    """The subprotocol a client offers to present `token`."""
    return TOKEN_SUBPROTOCOL + base64.urlsafe_b64encode(token.encode()).decode().rstrip("=")


def presented_token(websocket: WebSocket) -> str | None:
    """The Authorization header, or the token subprotocol read as one."""
    if header := websocket.headers.get("authorization"):
        return header
    for offered in websocket.scope.get("subprotocols", []):
        if offered.startswith(TOKEN_SUBPROTOCOL):
            encoded = offered[len(TOKEN_SUBPROTOCOL) :]
            try:
                token = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
                return f"Bearer {token.decode()}"
            except (ValueError, UnicodeDecodeError):
                return None
    return None


@router.websocket("/ws")
async def live(websocket: WebSocket) -> None:
    """Messages: {'type': 'batch', ...} per stored batch, {'type': 'timeline', ...} per
    finished request. Token as an 'Authorization: Bearer' header, or as the subprotocol
    token_subprotocol(token) offered beside 'kvscope.v1'; a token in the URL is refused."""
    settings = websocket.app.state.settings
    if "token" in websocket.query_params:
        await websocket.close(code=1008, reason="send the token as a header or subprotocol")
        return
    if not token_matches(settings, presented_token(websocket)):
        await websocket.close(code=1008, reason="missing or wrong token")
        return
    offered = websocket.scope.get("subprotocols", [])
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    hub = websocket.app.state.hub
    queue = hub.subscribe()
    receiver = asyncio.ensure_future(_until_closed(websocket))
    try:
        await websocket.send_json({"type": "hello"})
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if receiver in done:
                getter.cancel()
                break
            await websocket.send_json(getter.result())
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        hub.unsubscribe(queue)
        receiver.cancel()


async def _until_closed(websocket: WebSocket) -> None:
    """Reads (and ignores) client messages until the client goes away."""
    try:
        while True:
            await websocket.receive_text()
    except (WebSocketDisconnect, RuntimeError):
        return


def make_publisher(app):
    """The ingest service's on_batch hook: called in the ingest thread after each commit."""

    def publish(update: LiveUpdate) -> None:
        hub = app.state.hub
        hub.publish(update.message)
        if not update.finished:
            return
        try:
            with Session(app.state.engine) as session:
                sure = certainty.certainty(
                    session,
                    app.state.settings.gap_grace_s,
                    {instance_id for *_, instance_id in update.finished if instance_id is not None},
                )
                for request_no, trace_id, span_id, _ in update.finished:
                    request = session.exec(
                        select(Request).where(
                            Request.request_no == request_no,
                            Request.trace_id == trace_id,
                            Request.span_id == span_id,
                        )
                    ).first()
                    if request is not None:
                        timeline = build(session, request, sure)
                        hub.publish(
                            {"type": "timeline", "timeline": timeline.model_dump(mode="json")}
                        )
        except Exception:  # live updates are best effort; the stored batch is already safe
            logger.exception("could not publish timelines")

    return publish
