"""Fan-out of state changes to WebSocket clients, fed from the ingest threads."""

import asyncio
import threading

CLIENT_QUEUE = 256
"""Messages buffered per client; a slower client loses the oldest and is told it lagged."""


class Hub:
    """Thread-safe publisher: ingest threads publish, the event loop delivers."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: set[asyncio.Queue] = set()
        self._lock = threading.Lock()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    @property
    def has_clients(self) -> bool:
        return bool(self._clients)

    def subscribe(self) -> asyncio.Queue:
        queue: asyncio.Queue = asyncio.Queue(CLIENT_QUEUE)
        with self._lock:
            self._clients.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        with self._lock:
            self._clients.discard(queue)

    def publish(self, message: dict) -> None:
        """Callable from any thread; never blocks the caller."""
        loop = self._loop
        if loop is None or not self._clients or loop.is_closed():
            return
        with self._lock:
            clients = list(self._clients)
        for queue in clients:
            try:
                loop.call_soon_threadsafe(_offer, queue, message)
            except RuntimeError:  # the loop closed while we were publishing
                return


def _offer(queue: asyncio.Queue, message: dict) -> None:
    if queue.full():
        queue.get_nowait()
        message = {**message, "lagged": True}
    queue.put_nowait(message)
