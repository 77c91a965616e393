"""KV events: what vLLM's event streams claim each tier holds, against the connectors' spans."""

from fastapi import APIRouter, Request

from kvscope.backend.deps import SessionDep, TokenDep
from kvscope.backend.kv_events import divergence as divergence_module

router = APIRouter(prefix="/api/v1/kv-events", tags=["kv-events"], dependencies=[TokenDep])


@router.get(
    "/divergence",
    response_model=divergence_module.KVEventsDivergence,
    summary="Per engine and tier: blocks claimed by KV events, held by spans, sequence gaps",
)
def get_divergence(request: Request, session: SessionDep):
    subscriber = getattr(request.app.state, "kv_events", None)
    if subscriber is None:
        return divergence_module.disabled()
    streams = subscriber.ledger.snapshot()
    return divergence_module.divergence(session.connection(), streams, subscriber.running)
