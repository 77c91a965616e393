"""Decode and derive of one export request: the pure-Python part, run here or in a worker."""

import time
from dataclasses import dataclass

from kvscope.backend.ingest import decode
from kvscope.backend.ingest.bound import Limits
from kvscope.backend.ingest.derive import derive
from kvscope.backend.ingest.facts import Facts


@dataclass(slots=True)
class Prepared:
    """An export request decoded and turned into rows, ready to write (and to pickle)."""

    facts: Facts | None  # None when no span was valid
    resources: dict[str, dict]
    rejected: int
    message: str | None
    received_ns: int


def prepare(body: bytes, content_type: str, limits: Limits) -> Prepared:
    """The pure-Python part of ingest; PayloadError if the body cannot be read at all."""
    request = decode.parse_body(body, content_type)
    decoded = decode.decode(request, limits)
    received_ns = time.time_ns()
    facts = derive(decoded, received_ns) if decoded.spans else None
    return Prepared(facts, decoded.resources, decoded.rejected, decoded.message, received_ns)
