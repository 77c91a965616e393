"""kvscope.dashboard: the Streamlit dashboard that reads the kvscope backend's API."""

from kvscope.dashboard.launch import run, start

__all__ = ["run", "start"]
