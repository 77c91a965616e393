"""Spans timed by time.monotonic() readings: a near-instant one never ends before it starts,
so the backend (which refuses such a span, leaving a hole in its stream) stores every one."""

import time

from kvscope.backend.ingest.bound import invalid_reason
from kvscope.traces import names
from kvscope.traces.facts import record_timed_span


def test_an_instant_span_never_ends_before_it_starts_and_durations_are_kept(spans):
    now = time.monotonic()
    for i in range(200):  # separate conversions of each end drifted apart by a few ns
        record_timed_span(names.SPAN_TRANSFER, f"timed-{i}", now, now, None, {})
    record_timed_span(names.SPAN_TRANSFER, "timed-long", now, now + 0.25, None, {})
    found = [  # only this test's: an earlier test's worker thread may still end a transfer span
        span
        for span in spans()
        if span.name == names.SPAN_TRANSFER
        and str(span.attributes.get(names.REQUEST_ID, "")).startswith("timed-")
    ]
    assert len(found) == 201
    for span in found:
        context = span.context
        reason = invalid_reason(
            context.trace_id.to_bytes(16, "big"),
            context.span_id.to_bytes(8, "big"),
            b"",
            span.name,
            span.start_time,
            span.end_time,
        )
        assert reason is None, (span.start_time, span.end_time)
    long = next(s for s in found if s.attributes[names.REQUEST_ID] == "timed-long")
    assert long.end_time - long.start_time == 250_000_000
