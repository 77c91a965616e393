"""Keeps secrets out of uvicorn's logs: token-like query values in logged paths are redacted."""

import logging
import re

_SECRET_QUERY = re.compile(r"([?&](?:token|access_token|api_key|key)=)[^&\s\"]*", re.IGNORECASE)

LOGGERS = ("uvicorn.access", "uvicorn.error")
"""uvicorn writes the HTTP request line to the first and a WebSocket's path to the second."""


def redacted(text: str) -> str:
    return _SECRET_QUERY.sub(r"\1[redacted]", text)


class RedactSecrets(logging.Filter):
    """Rewrites a record's arguments (uvicorn logs the path as one of them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redacted(arg) if isinstance(arg, str) else arg for arg in record.args
            )
        elif isinstance(record.msg, str):
            record.msg = redacted(record.msg)
        return True


def install() -> None:
    """On uvicorn's loggers, once; uvicorn configures logging before it builds the app
    (a --factory too), and its dictConfig keeps filters added to loggers afterwards."""
    for name in LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(existing, RedactSecrets) for existing in target.filters):
            target.addFilter(RedactSecrets())
