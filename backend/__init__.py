"""kvscope.backend: OTLP receiver, SQL store of KV state and timelines, REST and WebSocket API."""

from importlib.util import find_spec

_NEEDS = ("fastapi", "uvicorn", "sqlmodel", "pydantic_settings")
if _missing := [name for name in _NEEDS if find_spec(name) is None]:
    raise ImportError(
        f"kvscope.backend needs {', '.join(_missing)}: pip install 'kvscope[backend]'"
    )
