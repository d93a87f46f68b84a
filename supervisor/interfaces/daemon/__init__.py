"""The daemon: one Supervisor behind an HTTP API on a unix socket (optionally loopback TCP)."""
