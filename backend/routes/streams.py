"""Span streams: per process, how many spans arrived and which seq numbers are missing."""

import time

from fastapi import APIRouter
from sqlmodel import col, select

from kvscope.backend.db import seqs
from kvscope.backend.db.models import Process
from kvscope.backend.deps import SessionDep, SettingsDep, TokenDep
from kvscope.backend.queries import certainty
from kvscope.backend.queries.schemas import StreamPublic

router = APIRouter(prefix="/api/v1/streams", tags=["streams"], dependencies=[TokenDep])


@router.get(
    "",
    response_model=list[StreamPublic],
    summary="Completeness of each process's span stream (gap detection)",
)
def list_streams(session: SessionDep, settings: SettingsDep):
    counts = seqs.received_counts(session.connection())
    gaps = certainty.gaps(session, settings.gap_grace_s, now_ns=time.time_ns())
    streams = []
    for process in session.exec(select(Process).order_by(col(Process.first_seen_ns))).all():
        received, highest = counts.get(process.instance_id, (0, -1))
        holes = [g for g in gaps if g.origin == process.instance_id]
        streams.append(
            StreamPublic(
                origin=process.instance_id,
                service_name=process.service_name,
                engine_id=process.engine_id,
                received=received,
                highest_seq=highest,
                holes=holes,
                telemetry_emitted=process.telemetry_emitted,
                telemetry_dropped=process.telemetry_dropped,
                status=stream_status(holes, process.telemetry_dropped),
            )
        )
    return streams


def stream_status(holes, dropped: int | None) -> str:
    """'complete', 'pending' (holes that may still fill) or 'lossy' (spans known lost)."""
    if dropped or any(h.state == "missing" for h in holes):
        return "lossy"
    return "pending" if holes else "complete"
