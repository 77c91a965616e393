"""The read book: failed reads wait for NIXL's release; closing reports the ones still held."""

import time

from kvscope.connector.p2p.transport import nixl_agent
from kvscope.connector.p2p.transport.reads import Inflight, ReadBook


class _Agent:
    def check_xfer_state(self, handle):
        return "PROC"  # a hung owner: the read never ends by itself


def _timed_out_read(book: ReadBook) -> Inflight:
    now = time.monotonic()
    xfer = Inflight(1, "peer", object(), num_blocks=4, started=now - 1.0, deadline=now - 0.5)
    book.inflight[1] = xfer
    return xfer


def test_a_held_read_is_reported_when_nixl_releases_it(monkeypatch):
    releases = iter([False, False, True])
    monkeypatch.setattr(nixl_agent, "release_quietly", lambda handle: next(releases))
    book = ReadBook()
    xfer = _timed_out_read(book)
    assert not book.check(_Agent(), xfer, time.monotonic())
    assert book.results == {} and book.pending_release and not book.inflight
    assert not book.retry_releases() and book.results == {}
    assert book.retry_releases()
    assert "timed out" in book.results[1].cause and not book.pending_release


def test_closing_reports_reads_nixl_never_released(monkeypatch):
    monkeypatch.setattr(nixl_agent, "release_quietly", lambda handle: False)
    book = ReadBook()
    book.check(_Agent(), _timed_out_read(book), time.monotonic())
    book.close("the transport was closed during the read")
    assert "timed out" in book.results[1].cause
    assert "closed during the read before NIXL released the read" in book.results[1].cause


def test_a_completed_read_is_reported_at_once_even_if_its_release_fails(monkeypatch):
    monkeypatch.setattr(nixl_agent, "release_quietly", lambda handle: False)
    book = ReadBook()
    xfer = Inflight(2, "peer", object(), num_blocks=1)
    assert book.end(xfer, "")  # every byte arrived: only the handle waits for a retry
    assert book.results[2].ok and book.unreleased == [xfer.handle]
