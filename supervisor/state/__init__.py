"""State layer: the SQLite store, task records, event logs, sinks and output files."""
