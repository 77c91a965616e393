"""Browser guard: refuses foreign Origins, unknown Hosts and tokenless reach beyond loopback.

A web page the operator opens can talk to a backend on 127.0.0.1: cross-site (its Origin is
foreign; a WebSocket is not covered by CORS at all) or through DNS rebinding (its Origin and
Host name the attacker's domain, now resolving here). Requests without an Origin come from
programs (exporters, the dashboard's server side, curl), not from a page, and pass.
"""

import logging
from ipaddress import ip_address
from urllib.parse import urlsplit

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from kvscope.backend.settings import Settings, bind_refusal, has_real_token

logger = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def split_list(value: str) -> frozenset[str]:
    return frozenset(item.strip().lower().rstrip("/") for item in value.split(",") if item.strip())


def host_and_port(authority: str, scheme: str) -> tuple[str, int | None]:
    """('127.0.0.1', 4318) from '127.0.0.1:4318'; brackets kept off IPv6 literals."""
    parts = urlsplit(f"//{authority}")
    try:
        port = parts.port
    except ValueError:
        return authority, None
    return (parts.hostname or ""), port or _DEFAULT_PORTS.get(scheme)


def is_loopback_name(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


class BrowserGuard:
    """ASGI middleware over HTTP and WebSocket; refusals say which setting allows more."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.origins = split_list(settings.allowed_origins)
        self.hosts = split_list(settings.allowed_hosts)
        self.tokenless = not has_real_token(settings)
        self.settings = settings
        self._warned = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        problem = self.problem(scope)
        if problem is None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            # Before accept, a close is answered as HTTP 403 to the handshake.
            await send({"type": "websocket.close", "code": 1008, "reason": problem[:120]})
            return
        await JSONResponse({"detail": problem}, status_code=403)(scope, receive, send)

    def problem(self, scope: Scope) -> str | None:
        """Why this request is refused, or None."""
        headers = {k: v for k, v in scope["headers"] if k in (b"host", b"origin")}
        host = headers.get(b"host", b"").decode("latin-1").strip().lower()
        origin = headers.get(b"origin")
        return (
            self._reach_problem(scope)
            or self._host_problem(host, scope)
            or (None if origin is None else self._origin_problem(origin, host, scope))
        )

    def _reach_problem(self, scope: Scope) -> str | None:
        # The bind check for every way of starting (uvicorn --factory too): a connection that
        # arrived on a non-loopback address needs a real token.
        server = scope.get("server")
        if not self.tokenless or not server:
            return None
        refusal = bind_refusal(self.settings, str(server[0]))
        if refusal and not self._warned:
            self._warned = True
            logger.error("%s (requests from beyond loopback get 403)", refusal)
        return refusal

    def _host_problem(self, host: str, scope: Scope) -> str | None:
        # With a real token a rebinding page cannot read anything; without one, only names
        # that resolve here by construction are served.
        if not self.tokenless or not host or "*" in self.hosts:
            return None
        name, _ = host_and_port(host, scope.get("scheme", "http"))
        if is_loopback_name(name) or name in self.hosts:
            return None
        return (
            f"Host {host!r} is not a loopback name and this backend has no token: use "
            "http://127.0.0.1, add the name to KVSCOPE_BACKEND_ALLOWED_HOSTS, or set "
            "KVSCOPE_BACKEND_TOKEN"
        )

    def _origin_problem(self, raw: bytes, host: str, scope: Scope) -> str | None:
        origin = raw.decode("latin-1").strip().lower().rstrip("/")
        if "*" in self.origins or origin in self.origins or self._same_origin(origin, host, scope):
            return None
        return (
            f"Origin {origin!r} is not allowed (a web page from another site): add it to "
            "KVSCOPE_BACKEND_ALLOWED_ORIGINS (comma-separated) if it is yours"
        )

    @staticmethod
    def _same_origin(origin: str, host: str, scope: Scope) -> bool:
        """The page came from this backend (its /docs): same host and port (the Host header
        is already vetted above). 'null' (sandboxed or file pages) never matches."""
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not host:
            return False
        try:
            origin_port = parts.port or _DEFAULT_PORTS[parts.scheme]
        except ValueError:
            return False
        request_scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        name, port = host_and_port(host, request_scheme)
        return (parts.hostname, origin_port) == (name, port)
