"""Backend benches: ingest against the OTel SDK's clients, the backend at scale, PostgreSQL."""
