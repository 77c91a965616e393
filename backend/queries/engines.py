"""Engines as an operator names them: service name and role, their processes, gone or not."""

from pydantic import BaseModel
from sqlalchemy import Connection, text

from kvscope.backend.db.liveness import gone_processes

_PROCESSES = text(
    "SELECT instance_id, service_name, engine_id, kv_role, last_seen_ns FROM process "
    "ORDER BY first_seen_ns"
)


class EnginePublic(BaseModel):
    engine_id: str
    label: str  # 'vllm-prefill (kv_producer)': service name and role, the id if neither
    service_name: str | None
    kv_role: str | None
    processes: int
    last_seen_ns: int
    gone: bool  # every process of it stopped reporting (its leases closed as 'engine lost')
    instance_ids: list[str]


def label(engine_id: str, service_name: str | None, kv_role: str | None) -> str:
    name = service_name or engine_id[:8]
    return f"{name} ({kv_role})" if kv_role else name


def engines(connection: Connection, now_ns: int, lost_after_s: float) -> list[EnginePublic]:
    """One entry per engine id (a process without one stands for itself)."""
    gone = gone_processes(connection, now_ns, lost_after_s)
    processes = list(connection.execute(_PROCESSES))
    # vLLM's own API server names no engine id: it belongs to the one engine of its service.
    by_service: dict[str, set[str]] = {}
    for row in processes:
        if row.engine_id and row.service_name:
            by_service.setdefault(row.service_name, set()).add(row.engine_id)
    grouped: dict[str, list] = {}
    for row in processes:
        engines_of_service = by_service.get(row.service_name or "", set())
        alone = next(iter(engines_of_service)) if len(engines_of_service) == 1 else None
        grouped.setdefault(row.engine_id or alone or row.instance_id, []).append(row)
    found = []
    for engine_id, rows in grouped.items():
        # Its processes' service name (one server's processes share OTEL_SERVICE_NAME); if
        # they differ, the most common, then the first in order: the same answer every time.
        names = sorted(r.service_name for r in rows if r.service_name)
        service = max(names, key=names.count) if names else None
        role = next((r.kv_role for r in rows if r.kv_role), None)
        found.append(
            EnginePublic(
                engine_id=engine_id,
                label=label(engine_id, service, role),
                service_name=service,
                kv_role=role,
                processes=len(rows),
                last_seen_ns=max(r.last_seen_ns for r in rows),
                gone=all(r.instance_id in gone for r in rows),
                instance_ids=[r.instance_id for r in rows],
            )
        )
    return sorted(found, key=lambda e: (e.gone, e.label))
