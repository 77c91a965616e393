"""Tests of what the routes read: state, truth, clocks, tiers, block groups."""
