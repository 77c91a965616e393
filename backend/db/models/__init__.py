"""SQLModel tables and their public schemas: one family (XBase, X, XPublic) per entity.

Importing this package registers every table on SQLModel.metadata; a module per kind of row."""

from kvscope.backend.db.models.measures import Latency, Lookup, SeriesRollup
from kvscope.backend.db.models.requests import (
    Failure,
    FailureBase,
    FailurePublic,
    Request,
    RequestBase,
    RequestNumber,
    RequestPublic,
    TimelinePoint,
    TimelinePointBase,
    TimelinePointPublic,
    Transfer,
    TransferBase,
    TransferPublic,
)
from kvscope.backend.db.models.spans import Span, SpanBase, SpanPublic
from kvscope.backend.db.models.state import (
    Block,
    BlockBase,
    BlockPublic,
    Lease,
    LeaseBase,
    LeasePublic,
)
from kvscope.backend.db.models.streams import Process, SeqRange

__all__ = [
    "Block",
    "BlockBase",
    "BlockPublic",
    "Failure",
    "FailureBase",
    "FailurePublic",
    "Latency",
    "Lease",
    "LeaseBase",
    "LeasePublic",
    "Lookup",
    "Process",
    "Request",
    "RequestBase",
    "RequestNumber",
    "RequestPublic",
    "SeqRange",
    "SeriesRollup",
    "Span",
    "SpanBase",
    "SpanPublic",
    "TimelinePoint",
    "TimelinePointBase",
    "TimelinePointPublic",
    "Transfer",
    "TransferBase",
    "TransferPublic",
]
