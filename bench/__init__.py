"""Benchmarks of the supervisor against raw docker-py, raw attach streams and a plain pipe.

Run with ``make bench`` or ``python -m bench.run [names...] [--quick]``; see bench/README.md.
"""
