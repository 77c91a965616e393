"""Lease ids, one sequence per process, shared by every connector that grants leases."""

import itertools
from collections.abc import Callable

next_lease_id: Callable[[], int] = itertools.count(1).__next__
"""Lease ids, unique within a process: connectors composed in one engine (the offload and
P2P children of a Multi) report leases under one engine id, so they must not reuse numbers."""
