"""The P2P handshake over TCP: a KV owner serves its NIXL agent metadata and KV layout to peers."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from kvscope.connector.p2p.transport.layout import KVLayout

logger = logging.getLogger(__name__)

PROTOCOL_VERSION: Final = 1
"""Version of the frame format and messages; a peer speaking another version is refused."""
MAGIC: Final = b"KVSC"
"""First bytes of every frame, so that stray traffic is recognised as such."""
MAX_HEADER_BYTES: Final = 64 * 1024
"""Largest JSON header accepted; checked before reading it."""
MAX_BODY_BYTES: Final = 16 * 1024 * 1024
"""Largest body (NIXL agent metadata) accepted; checked before reading it."""
MAX_REQUEST_BODY_BYTES: Final = 0
"""A request carries no body: the server refuses one before reading it."""
MAX_ERROR_CHARS: Final = 300
"""An error answer quotes at most this much, so it never outgrows a frame."""
DEFAULT_HOST: Final = "127.0.0.1"

# magic, protocol version, flags (0, reserved), header length, body length
_PREFIX: Final = struct.Struct("!4sHHII")


class FrameError(ValueError):
    """A message that is not a well-formed frame of our protocol version; says what is wrong."""


class SideChannelError(RuntimeError):
    """A handshake failed: the peer is unreachable, silent, refused us or sent a bad answer."""


@dataclass(frozen=True)
class Frame:
    """One message: a JSON header and raw bytes, never pickled."""

    header: dict[str, Any]
    body: bytes = b""


@dataclass(frozen=True)
class PeerInfo:
    """What a peer needs to read our KV blocks: the NIXL agent and where the blocks are."""

    agent_name: str
    agent_metadata: bytes
    layout: KVLayout
    registration: int = 0  # leases naming an older one were revoked (RemotePrefill)

    def to_frame(self) -> Frame:
        header = {
            "type": "peer_info",
            "agent_name": self.agent_name,
            "layout": self.layout.to_wire(),
            "registration": self.registration,
        }
        return Frame(header, self.agent_metadata)

    @classmethod
    def from_frame(cls, frame: Frame) -> PeerInfo:
        if frame.header["type"] != "peer_info":
            raise ValueError(f"expected a peer_info answer, got {_quote(frame.header['type'])}")
        agent_name = frame.header.get("agent_name")
        if not isinstance(agent_name, str) or not agent_name or not frame.body:
            raise ValueError("peer_info without an agent name or agent metadata")
        registration = frame.header.get("registration", 0)
        if not isinstance(registration, int) or isinstance(registration, bool) or registration < 0:
            raise ValueError(f"peer_info with a bad registration: {_quote(registration)}")
        layout = KVLayout.from_wire(frame.header.get("layout"))
        return cls(agent_name, frame.body, layout, registration)


def encode_frame(frame: Frame) -> bytes:
    header = json.dumps(frame.header, separators=(",", ":")).encode()
    if len(header) > MAX_HEADER_BYTES or len(frame.body) > MAX_BODY_BYTES:
        raise ValueError(f"frame too large: header {len(header)} B, body {len(frame.body)} B")
    prefix = _PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, len(header), len(frame.body))
    return prefix + header + frame.body


def read_frame(
    sock: socket.socket, deadline: float | None = None, max_body_bytes: int = MAX_BODY_BYTES
) -> Frame:
    """Read one frame; refuse bad magic, another version or oversized parts before reading them.

    `deadline` (time.monotonic()) bounds the whole read, however slowly the peer drips bytes.
    Raises FrameError for a malformed frame, ConnectionError or TimeoutError for a short one.
    """
    prefix = _recv_exact(sock, _PREFIX.size, deadline)
    magic, version, flags, header_len, body_len = _PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise FrameError(f"not a kvscope side-channel message (starts with {magic!r})")
    if version != PROTOCOL_VERSION:
        raise FrameError(
            f"side-channel protocol version {version} is not supported (this side speaks"
            f" {PROTOCOL_VERSION}): run the same kvscope version on prefill and decode"
        )
    if flags != 0:
        raise FrameError(f"frame flags must be 0 in protocol version {PROTOCOL_VERSION}")
    if header_len > MAX_HEADER_BYTES or body_len > max_body_bytes:
        raise FrameError(
            f"message too large: header {header_len} B (max {MAX_HEADER_BYTES}),"
            f" body {body_len} B (max {max_body_bytes})"
        )
    header = _parse_header(_recv_exact(sock, header_len, deadline))
    return Frame(header, _recv_exact(sock, body_len, deadline))


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, huge ints, deep nesting
        raise FrameError(f"header is not JSON: {_quote(str(exc))}") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise FrameError("header must be a JSON object with a 'type'")
    return header


def _recv_exact(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    chunks: list[bytes] = []
    received = 0
    while received < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"timed out after {received} of {size} bytes")
            sock.settimeout(left)
        chunk = sock.recv(min(size - received, 1 << 20))
        if not chunk:
            raise ConnectionError(f"connection closed after {received} of {size} bytes")
        chunks.append(chunk)
        received += len(chunk)
    return b"".join(chunks)


def _quote(value: object) -> str:
    """A peer-supplied value for an error message: its repr, cut to a bounded length."""
    return _cut(repr(value))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "...(cut)"


class SideChannelServer:
    """Answers `get_peer_info` requests from a daemon thread; survives any bad client.

    Each connection gets `io_timeout_s` in all to deliver its request, so a client that drips
    bytes cannot hold one of the `max_connections` slots for long. Anything but a good request
    gets an error answer saying what was wrong (when the client still reads), then the
    connection is closed; nothing a client sends is ever executed or unpickled.
    """

    def __init__(
        self,
        host: str = DEFAULT_HOST,
        port: int = 0,
        io_timeout_s: float = 2.0,
        max_connections: int = 16,
        on_request: Callable[[], None] | None = None,
    ) -> None:
        self._peer_infos: dict[int, PeerInfo] = {}  # by tp rank
        self._withdrawn: dict[int, str] = {}  # tp rank -> why it serves nothing now
        self._io_timeout_s = io_timeout_s
        self._on_request = on_request
        self._connection_slots = threading.BoundedSemaphore(max_connections)
        self._closed = threading.Event()
        self._listener = socket.create_server((host, port))
        # accept() wakes twice a second to notice close(): negligible CPU, no extra socket tricks.
        self._listener.settimeout(0.5)
        self.host, self.port = self._listener.getsockname()[:2]
        self.requests_served = 0
        self.requests_refused = 0
        self._thread = threading.Thread(target=self._accept_loop, name="kvscope-p2p-side-channel")
        self._thread.daemon = True
        self._thread.start()

    def publish(self, info: PeerInfo) -> None:
        """Serve this agent's metadata and layout to peers asking for its tp rank."""
        self._withdrawn.pop(info.layout.tp_rank, None)
        self._peer_infos[info.layout.tp_rank] = info

    def withdraw(self, tp_rank: int, reason: str) -> None:
        """Serve nothing for this rank until the next publish; handshakes are told `reason`."""
        self._withdrawn[tp_rank] = reason
        self._peer_infos.pop(tp_rank, None)

    def close(self) -> None:
        self._closed.set()
        self._thread.join(timeout=2.0)
        self._listener.close()

    def __enter__(self) -> SideChannelServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._connection_slots.acquire(blocking=False):
                conn.close()  # too many open handshakes: the client retries or times out
                continue
            threading.Thread(target=self._serve_one, args=(conn,), daemon=True).start()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                deadline = time.monotonic() + self._io_timeout_s
                answer = encode_frame(self._answer(conn, deadline))
                conn.settimeout(self._io_timeout_s)
                conn.sendall(answer)
                conn.shutdown(socket.SHUT_WR)
                _drain(conn, self._io_timeout_s)
        except Exception as exc:  # a client that vanished or stalled must not stop the server
            logger.debug("side channel: dropped a connection: %s", exc)
        finally:
            self._connection_slots.release()

    def _answer(self, conn: socket.socket, deadline: float) -> Frame:
        try:
            request = read_frame(conn, deadline, MAX_REQUEST_BODY_BYTES)
            if request.header["type"] != "get_peer_info":
                raise FrameError(f"unknown request type {_quote(request.header['type'])}")
            tp_rank = _tp_rank_of(request.header)
            info = self._peer_infos.get(tp_rank)
            if info is None and tp_rank in self._withdrawn:
                raise FrameError(f"tp_rank {tp_rank}: {self._withdrawn[tp_rank]}")
            if info is None:
                raise FrameError(
                    f"no KV served for tp_rank {tp_rank} (ranks {sorted(self._peer_infos)})"
                )
        except (FrameError, ConnectionError, TimeoutError, struct.error) as exc:
            self.requests_refused += 1
            reason = f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc)
            return Frame({"type": "error", "error": _cut(reason)})
        if self._on_request is not None:
            self._on_request()
        self.requests_served += 1
        return info.to_frame()


def _drain(conn: socket.socket, seconds: float, limit: int = 64 * 1024) -> None:
    """Read what the client still sends, for a bounded time: closing with unread input resets
    the connection, which can destroy our answer (e.g. the error for a garbage request)."""
    deadline = time.monotonic() + seconds
    drained = 0
    with contextlib.suppress(TimeoutError):
        while drained < limit and (chunk := _recv_some(conn, deadline)):
            drained += len(chunk)


def _recv_some(conn: socket.socket, deadline: float) -> bytes:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    conn.settimeout(left)
    return conn.recv(16 * 1024)


def _tp_rank_of(header: dict[str, Any]) -> int:
    tp_rank = header.get("tp_rank", 0)
    if not isinstance(tp_rank, int) or isinstance(tp_rank, bool):
        raise FrameError(f"tp_rank must be an integer, got {_quote(tp_rank)}")
    return tp_rank


def fetch_peer_info(host: str, port: int, tp_rank: int = 0, timeout_s: float = 5.0) -> PeerInfo:
    """Ask the KV owner at host:port for its agent metadata and layout."""
    where = f"side channel {host}:{port}"
    deadline = time.monotonic() + timeout_s  # for the whole handshake, however slow the peer
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            request = Frame({"type": "get_peer_info", "tp_rank": tp_rank})
            sock.sendall(encode_frame(request))
            answer = read_frame(sock, deadline)
    except TimeoutError:
        raise SideChannelError(
            f"{where} did not answer within {timeout_s} s: is the prefill engine alive?"
        ) from None
    except (OSError, ValueError, struct.error) as exc:
        raise SideChannelError(f"{where}: {exc}") from None
    if answer.header["type"] == "error":
        reason = _cut(str(answer.header.get("error")))
        raise SideChannelError(f"{where} refused the handshake: {reason}")
    try:
        return PeerInfo.from_frame(answer)
    except ValueError as exc:
        raise SideChannelError(f"{where} sent a bad peer_info: {exc}") from None
