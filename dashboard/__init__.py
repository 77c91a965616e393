"""kvscope.dashboard: the Streamlit dashboard that reads the kvscope backend's API."""

from importlib.util import find_spec

_NEEDS = ("streamlit", "httpx", "pydantic_settings")
if _missing := [name for name in _NEEDS if find_spec(name) is None]:
    raise ImportError(
        f"kvscope.dashboard needs {', '.join(_missing)}: pip install 'kvscope[dashboard]'"
    )

from kvscope.dashboard.launch import run, start  # noqa: E402 (after the check that names the extra)

__all__ = ["run", "start"]
