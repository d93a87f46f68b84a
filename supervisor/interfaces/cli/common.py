"""Shared helpers for CLI subcommands: option types, output formatting, errors."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from supervisor.core.errors import SpecError
from supervisor.core.text import parse_duration_ms


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


def duration_ms(text: str) -> int:
    """argparse type: a duration (``500ms``, ``30s``, ``5m``, ``1h``; bare numbers are
    seconds) in milliseconds. A bad or huge one is a usage error naming the option."""
    try:
        return parse_duration_ms(text, "duration")
    except SpecError as exc:
        # argparse puts "argument --timeout: " in front; the problem says the rest.
        raise argparse.ArgumentTypeError(exc.problem) from None


def duration_s(text: str) -> float:
    """argparse type: a duration in seconds (whole milliseconds, at least 1ms)."""
    return duration_ms(text) / 1000


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
    sys.stderr.write(f"sandvisor: error: {message}\n")
    return code


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the examples in epilogs as written."""
