"""The topology runs' leak check is harness/leaks.py's (suite.py imports these from here)."""

from kvscope.harness.leaks import engine_leaks
from kvscope.harness.leaks import scheduler_in_process as in_process

__all__ = ["engine_leaks", "in_process"]
