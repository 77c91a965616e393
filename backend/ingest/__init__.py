"""The ingest pipeline, a module a stage: receive -> body -> decode -> bound -> derive -> write."""
