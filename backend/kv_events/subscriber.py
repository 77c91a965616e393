"""A daemon thread that reads vLLM's ZMQ KV-event streams (one SUB socket per engine) into a ledger.

vLLM's publisher binds `tcp://*:PORT`; each socket here connects to one such endpoint and
subscribes to the topic. A batch is three frames: topic, an 8-byte big-endian sequence number,
and a msgspec-encoded KVEventBatch. The thread never touches the database, so a slow or silent
stream can never hold up span ingest; stop() ends it within one poll interval. It imports vLLM
(its event types, some 20 s on a busy machine) itself, so the backend starts without waiting.
"""

import logging
import threading

import msgspec
import zmq

from kvscope.backend.kv_events.ledger import EventLedger

logger = logging.getLogger(__name__)

POLL_MS = 100
"""How long one poll waits: the longest stop() waits for the thread to notice."""
RECEIVE_HWM = 100_000
"""Batches queued per stream before ZMQ drops them (then counted as a sequence gap)."""


def parse_endpoints(setting: str) -> dict[str, str | None]:
    """'ENGINE=tcp://host:port,tcp://host:port' -> endpoint -> engine id (None: not named)."""
    endpoints: dict[str, str | None] = {}
    for item in (part.strip() for part in setting.split(",")):
        if not item:
            continue
        engine, sep, endpoint = item.rpartition("=")
        endpoint = endpoint.strip()
        if not endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"KVSCOPE_KV_EVENTS: {item!r} is not [ENGINE_ID=]tcp://HOST:PORT")
        endpoints[endpoint] = engine.strip() or None if sep else None
    return endpoints


class KVEventSubscriber:
    """Subscribes to every endpoint and feeds ledger until stop()."""

    def __init__(self, endpoints: dict[str, str | None], topic: str = "kv-events") -> None:
        self.ledger = EventLedger(endpoints)
        self.topic = topic.encode()
        self._endpoints = list(endpoints)
        self._stop = threading.Event()
        self._listening = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)

    def start(self) -> "KVEventSubscriber":
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Its sockets are connected (or connecting) and it reads them."""
        return self._listening.is_set() and self._thread.is_alive()

    def _run(self) -> None:
        try:
            from vllm.distributed.kv_events import KVEventBatch
        except ImportError:
            logger.error("KVSCOPE_KV_EVENTS: decoding vLLM's KV events needs vllm installed")
            return
        self._batch_type = KVEventBatch
        context = zmq.Context()
        sockets: dict[zmq.Socket, str] = {}
        poller = zmq.Poller()
        try:
            for endpoint in self._endpoints:
                socket = context.socket(zmq.SUB)
                socket.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
                socket.setsockopt(zmq.SUBSCRIBE, self.topic)
                socket.connect(endpoint.replace("tcp://*:", "tcp://127.0.0.1:"))
                sockets[socket] = endpoint
                poller.register(socket, zmq.POLLIN)
            self._listening.set()
            while not self._stop.is_set():
                for socket, _ in poller.poll(POLL_MS):
                    self._receive(socket, sockets[socket])
        except Exception:  # a broken stream must not end the backend, only this reader
            logger.exception("kv events: the subscriber stopped")
        finally:
            for socket in sockets:
                socket.close(linger=0)
            context.term()

    def _receive(self, socket: zmq.Socket, endpoint: str) -> None:
        while True:
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3 or frames[0] != self.topic or len(frames[1]) != 8:
                self.ledger.undecodable(endpoint)
                continue
            try:
                batch = msgspec.msgpack.decode(frames[2], type=self._batch_type)
            except msgspec.DecodeError:
                self.ledger.undecodable(endpoint)
                continue
            self.ledger.record(endpoint, int.from_bytes(frames[1], "big"), batch)
