"""The benchmark report: runs every bench, collects recorded figures (names in figures/)."""
