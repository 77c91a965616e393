"""Predicted time to first token at another pool size, from each request's measured TTFT.

The model: a request's TTFT at another size is its measured TTFT (vLLM's llm_request span,
the backend's latency rows) less the prefill time its extra hit tokens spare plus the time
their loads take, each at the engine's measured rate (price.py):

    predicted = max(0, measured - (replayed hits - today's hits) * (1/prefill - 1/load))

today's hits being what the connector answered at the request's last lookup and the replayed
hits what the replay's pool answered there. It prices compute and load alone: queueing that a
faster prefill would shorten for the requests behind it is left as measured, so under load the
prediction is conservative in both directions.
"""

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection

from kvscope.backend.queries.aggregates import percentiles
from kvscope.backend.queries.plan.price import Rates

_TTFT = text(
    "SELECT request_id, ttft_ms FROM latency "
    "WHERE time_ns >= :since AND time_ns < :until AND ttft_ms IS NOT NULL"
)


@dataclass(frozen=True)
class MeasuredTtft:
    """The measured TTFT of each request of an engine's lookups that has one, in ms, with the
    hit tokens the connector answered it."""

    ttft_ms: dict[str, float]
    hit_tokens: dict[str, int]

    @property
    def p50_p95(self) -> tuple[float | None, float | None]:
        return percentiles(sorted(self.ttft_ms.values()))


def measured_ttft(
    connection: Connection, hit_tokens: dict[str, int], since_ns: int, until_ns: int
) -> MeasuredTtft:
    """The window's TTFTs of the requests in hit_tokens (by the engine's request id). vLLM's
    llm_request span names the API server's id: the engine's without its '-xxxxxxxx' tail."""
    by_id: dict[str, float] = {
        request_id: ttft
        for request_id, ttft in connection.execute(_TTFT, {"since": since_ns, "until": until_ns})
    }
    found: dict[str, float] = {}
    for req_id in hit_tokens:
        head, dash, tail = req_id.rpartition("-")
        ttft = by_id.get(req_id, by_id.get(head) if dash and len(tail) == 8 else None)
        if ttft is not None:
            found[req_id] = float(ttft)
    return MeasuredTtft(found, {r: hit_tokens[r] for r in found})


def predicted_ttft(
    today: MeasuredTtft, replayed_hits: dict[str, int], rates: Rates
) -> tuple[float | None, float | None]:
    """(p50, p95) in ms of the requests' TTFTs with the replay's hits; None without rates."""
    saved_s_per_token = rates.seconds_saved(1)
    if saved_s_per_token is None or not today.ttft_ms:
        return None, None
    predicted = [
        max(0.0, ttft - (replayed_hits.get(r, 0) - today.hit_tokens[r]) * saved_s_per_token * 1e3)
        for r, ttft in today.ttft_ms.items()
    ]
    return percentiles(sorted(predicted))
