"""PROVISIONAL (replaced by the linear-time scanner): the line scanner behind wait_for."""

from __future__ import annotations

import re
from dataclasses import dataclass

from supervisor.core.errors import SpecError
from supervisor.core.models import PatternMatch


@dataclass(frozen=True)
class Pattern:
    text: str
    regex: re.Pattern[bytes]


def compile_pattern(text: str) -> Pattern:
    try:
        return Pattern(text, re.compile(text.encode("utf-8")))
    except re.error as exc:
        raise SpecError(f"pattern: not a valid regular expression ({exc})") from exc


class LineScanner:
    def __init__(self, pattern: Pattern, from_offset: int = 0) -> None:
        self.pattern = pattern
        self.carry = b""
        self.offset = from_offset

    def feed(self, data: bytes, offset: int) -> PatternMatch | None:
        self.offset = offset + len(data)
        buf = self.carry + data
        base = offset - len(self.carry)
        lines = buf.split(b"\n")
        complete, self.carry = lines[:-1], lines[-1]
        pos = base
        for line in complete:
            if self.pattern.regex.search(line):
                return PatternMatch(line=line.decode("utf-8", "replace"), offset=pos)
            pos += len(line) + 1
        if len(self.carry) > 1 << 20 and self.pattern.regex.search(self.carry):
            return PatternMatch(line=self.carry.decode("utf-8", "replace"), offset=pos)
        return None

    def finish(self) -> PatternMatch | None:
        if self.carry and self.pattern.regex.search(self.carry):
            return PatternMatch(
                line=self.carry.decode("utf-8", "replace"),
                offset=self.offset - len(self.carry),
            )
        return None
