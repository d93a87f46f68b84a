"""Shared helpers for CLI subcommands: output formatting, durations, errors."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_duration_ms(text: str, *, default_unit: str = "s") -> int:
    """``500ms``, ``30s``, ``5m``, ``1h`` (bare numbers use ``default_unit``) -> milliseconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with ms, s, m or h (e.g. 500ms, 30s, 5m, 1h)"
        )
    value = int(float(match.group(1)) * _UNIT_MS[match.group(2) or default_unit])
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be at least 1ms")
    return value


def nonnegative_int(what: str) -> Callable[[str], int]:
    """argparse type: an integer >= 0 (``what`` names it in the error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
        return value

    return parse


def duration_s(text: str) -> float:
    """argparse type: a duration in seconds (float)."""
    return parse_duration_ms(text) / 1000


def duration_ms(text: str) -> int:
    """argparse type: a duration in milliseconds."""
    return parse_duration_ms(text)


def want_plain(args: argparse.Namespace) -> bool:
    """Plain lines (no table decorations) when stdout is not a terminal."""
    return not sys.stdout.isatty()


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Aligned columns for people; tab-separated lines when piped."""
    cells = [[("" if c is None else str(c)) for c in row] for row in rows]
    if not sys.stdout.isatty():
        for row in cells:
            sys.stdout.write("\t".join(row) + "\n")
        return
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    line = "  ".join(h.upper().ljust(widths[i]) for i, h in enumerate(headers))
    sys.stdout.write(line.rstrip() + "\n")
    for row in cells:
        sys.stdout.write("  ".join(c.ljust(widths[i]) for i, c in enumerate(row)).rstrip() + "\n")


def fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"sbx: error: {message}\n")
    return code


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in epilogs as written."""
