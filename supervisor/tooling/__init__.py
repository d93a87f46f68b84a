"""Tooling: offline image builds and readiness checks."""
