"""The pair probe waits for vLLM's slow first /server_info however short the other requests'
timeout (vLLM collects the system's environment before it answers that call)."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kvscope.cli.pair_probe import probe

SLOW_S = 1.5


class _SlowServerInfo(BaseHTTPRequestHandler):
    """/server_info after SLOW_S seconds, as vLLM's first call; every other path at once."""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path.startswith("/server_info"):
            time.sleep(SLOW_S)
            body = {"vllm_config": {"parallel_config": {"tensor_parallel_size": 1}}}
        else:
            body = {"data": []}
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args) -> None:
        pass


def test_a_slow_first_server_info_is_waited_for():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowServerInfo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = probe(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=0.5)
    finally:
        server.shutdown()
        server.server_close()
    assert not [error for error in found.errors if "/server_info" in error], found.errors
    assert found.facts["tensor_parallel_size"] == "1"


def test_metrics_that_are_not_prometheus_text_are_named_not_raised():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowServerInfo)  # /metrics answers JSON
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = probe(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=5)
    finally:
        server.shutdown()
        server.server_close()
    assert "not Prometheus text" in found.unknown["block_size"]
