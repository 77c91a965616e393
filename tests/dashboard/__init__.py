"""Tests of kvscope.dashboard: chart builders, the backend client, pages in a real browser."""
