"""Writes docs/reference/*.md from the code: `python scripts/docs_reference.py [--check]`."""
