"""The database: tables, engine, migrations, rollups, retention, checkpoints, seqs, bulk rows."""
