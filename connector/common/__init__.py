"""Engine-agnostic parts shared by the connectors: host block pool, leases, copy engine, faults."""
