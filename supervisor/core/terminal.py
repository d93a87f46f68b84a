"""Pure: a task's output rendered as a terminal would show it, for the agent to read.

The output file keeps every byte; what the agent is handed (MCP results, notification
tails, monitor events) goes through here first, so it reads like the screen a person would
have seen instead of escape bytes and hundreds of stale frames of one progress bar:

- SGR (colours, bold), every other CSI sequence, OSC (titles, hyperlinks: the link text is
  outside the sequence, so it stays) and DCS/APC/PM/SOS strings are removed;
- ``\\r`` returns to the line's start and what follows overwrites it; ``\\b`` steps back;
- cursor movement and erase sequences (``ESC[nA``, ``ESC[K``, ``ESC[J``, ``ESC[nG``,
  ``ESC[r;cH``, save/restore, insert/delete characters and lines) act on an editable region of
  the last ``SCREEN_LINES`` lines, so a multi-line redraw (npm, docker build, cargo, apt's
  progress row) collapses to its final frame; lines scrolled above the region are final;
- a clear screen (``ESC[2J``) keeps what was on it, as terminals keep it in their
  scrollback (the agent can read what scrolled by, a person could too);
- runs of identical lines (3 or more, when that is shorter) become the line once and
  ``[… repeated N times]`` (N: how often it appeared);
- every other control character, invalid UTF-8 and invisible/bidi character is shown as
  everywhere else (``core.visible``: ``\\x07``, U+FFFD for undecodable bytes).

Why a small state machine and not ``pyte`` (a VT100 emulator): pyte emulates a fixed
width and height, so long log lines would wrap and reflow at its width and everything above
its height would need its history screen; it dispatches every character through Python
(about 10x slower than the bulk text runs here), and it cannot say which input bytes it has
not interpreted yet, which the offset reads need (below). Build logs use a small subset of
VT100; that subset is implemented here, the rest of CSI is ignored.

Offsets stay honest. Input is bytes; a chunk that ends inside an escape sequence or a UTF-8
character is not interpreted up to its end: ``Rendered.end`` stops before the incomplete
sequence, so the next read (``next_offset``) starts on it and no byte is hidden. An OSC or
string sequence may not span a newline and is at most ``MAX_SEQUENCE`` bytes: anything else
is not a sequence and is shown (its ESC as ``\\x1b``).

Simplifications, on purpose: one character is one cell (wide characters, tabs and
combining marks are not measured), and ``\\n`` also returns to the line's start (output
captured without a terminal has no ``onlcr`` to do it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from supervisor.core.screen import MAX_SEQUENCE, SCREEN_LINES, Screen
from supervisor.core.text import utf8_safe_end
from supervisor.core.visible import visible

__all__ = [
    "MAX_SEQUENCE",
    "SCREEN_LINES",
    "Rendered",
    "TerminalRenderer",
    "render",
    "render_head",
    "render_tail",
    "render_text",
    "shown",
]

_ESCAPED_BYTE = re.compile(r"[\udc80-\udcff]")


@dataclass(frozen=True, slots=True)
class Rendered:
    """Rendered text and which input bytes it shows."""

    text: str
    """What a terminal would show (see the module docstring)."""
    start: int
    """Offset in the input where the bytes shown begin (0 unless a tail was cut)."""
    end: int
    """Offset just after the last byte interpreted; ``input[end:]`` is an incomplete escape
    sequence or character, left for the next read."""


def shown(text: str) -> str:
    """Rendered characters as the agent reads them: undecodable bytes (carried as
    surrogates) as U+FFFD, exactly as ``bytes.decode("utf-8", "replace")`` would show them,
    then every unsafe character visible (``core.visible``; tab and newline stay)."""
    if _ESCAPED_BYTE.search(text):
        try:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        except UnicodeEncodeError:  # other lone surrogates too: one U+FFFD per escaped byte
            text = _ESCAPED_BYTE.sub("\ufffd", text)
    return visible(text, keep="\t\n")


def _decode(data: bytes, final: bool) -> tuple[str, int]:
    """Text of ``data`` (undecodable bytes as surrogates, so lengths map back to bytes) and
    how many bytes it covers (an incomplete character at a non-final end is left out)."""
    used = len(data) if final else utf8_safe_end(data)
    return data[:used].decode("utf-8", "surrogateescape"), used


def _run(data: bytes, *, final: bool, base: int = 0) -> tuple[list[str], list[int], int]:
    """Final lines of ``data``, where each began, and the bytes interpreted."""
    text, used = _decode(data, final)
    screen = Screen(base=base)
    taken = screen.feed(text, final=final)
    if taken < len(text):
        used = base + len(text[:taken].encode("utf-8", "surrogateescape"))
    else:
        used += base
    lines, origins = screen.finish()
    return lines, origins, used


def render(data: bytes, *, final: bool = True) -> Rendered:
    """``data`` as a terminal would show it. Not ``final`` (more may follow): an incomplete
    escape sequence or character at the end is not interpreted (``end`` stops before it)."""
    lines, _, used = _run(data, final=final)
    return Rendered(shown("\n".join(lines)), 0, used)


def render_text(text: str) -> str:
    """Already decoded text (an event's field) as a terminal would show it. Rendering its
    own result again changes nothing."""
    screen = Screen()
    screen.feed(text, final=True)
    lines, _ = screen.finish()
    return shown("\n".join(lines))


def _fit_head(lines: list[str], origins: list[int], chars: int) -> int:
    """How many of the first lines fit in ``chars`` (newlines counted), at least none."""
    size = 0
    for i, line in enumerate(lines):
        size += len(line) + 1
        if size - 1 > chars:
            return i
    return len(lines)


def render_head(data: bytes, chars: int, *, final: bool = True) -> Rendered:
    """The start of ``data``'s rendering: the longest prefix of whole lines that fits in
    ``chars``; ``end`` is where the first line left out begins (the text is exactly the
    rendering of ``data[:end]``). A first line longer than ``chars`` is cut, with ``end``
    0: nothing was shown whole."""
    lines, origins, used = _run(data, final=final)
    k = _fit_head(lines, origins, chars)
    if k >= len(lines):
        return Rendered(shown("\n".join(lines)), 0, used)
    if k == 0:
        return Rendered(shown(lines[0][:chars]), 0, 0)
    end = origins[k]
    return Rendered(shown("\n".join(_run(data[:end], final=True)[0])), 0, end)


def _line_start(data: bytes, at: int) -> int:
    """The first line start at or after ``at``: after a newline, else after a carriage
    return (a progress bar that never ends its line), else ``at`` itself."""
    if at == 0 or data[at - 1 : at] == b"\n":
        return at
    for sep in (b"\n", b"\r"):
        found = data.find(sep, at)
        if found >= 0:
            return found + 1
    return at


def render_tail(
    data: bytes, chars: int, *, final: bool = True, whole: bool = True, floor: int = 0
) -> Rendered:
    """The end of ``data``'s rendering in at most ``chars`` characters, in whole lines from
    a line start at or after ``floor``: ``start`` is where the bytes shown begin (the text
    is the rendering of ``data[start:end]``, its front cut if a redraw made it longer).
    ``whole``: ``data`` begins at the start of the output (else a first partial line is
    skipped). When not even the last non-empty line fits whole, its end is shown."""
    begin = floor if whole or floor > 0 else 1
    begin = _line_start(data, begin) if begin else 0
    lines, origins, used = _run(data[begin:], final=final, base=begin)
    size, k = -1, len(lines)
    while k > 0 and size + len(lines[k - 1]) + 1 <= chars:
        size += len(lines[k - 1]) + 1
        k -= 1
    if k == 0:
        return Rendered(shown("\n".join(lines)), begin, used)
    if not any(lines[k:]):  # not one line with text fits: the end of the text, cut
        text = "\n".join(lines)[-chars:]
        return Rendered(shown(text), origins[k - 1], used)
    start = origins[k]
    again, _, used = _run(data[start:], final=final, base=start)
    return Rendered(shown("\n".join(again)[-chars:]), start, used)


class TerminalRenderer:
    """Incremental rendering: feed bytes as they come, get the lines no later byte can
    change (scrolled above the editable region); ``finish`` gives the rest. All pieces
    joined equal ``render`` of all the bytes, however the input was split."""

    def __init__(self, height: int = SCREEN_LINES) -> None:
        self._screen = Screen(height)
        self._carry = b""
        self._fed = 0
        self._emitted = 0

    @property
    def carry(self) -> bytes:
        """Bytes held back: an incomplete escape sequence or character at the end so far."""
        return self._carry

    @property
    def consumed(self) -> int:
        """Input bytes interpreted so far (fed minus ``carry``)."""
        return self._fed - len(self._carry)

    def feed(self, data: bytes) -> str:
        """Interpret ``data``; returns the newly final lines, each ending with a newline."""
        self._fed += len(data)
        buf = self._carry + data
        text, used = _decode(buf, final=False)
        taken = self._screen.feed(text, final=False)
        if taken < len(text):
            used = len(text[:taken].encode("utf-8", "surrogateescape"))
        self._carry = buf[used:]
        return self._take()

    def _take(self) -> str:
        out = self._screen.out
        if len(out) == self._emitted:
            return ""
        new = out[self._emitted :]
        self._emitted = len(out)
        return shown("\n".join(new) + "\n")

    def finish(self) -> str:
        """The output ended: interpret the carry as it is and return everything not yet
        returned (no newline after the last line)."""
        text, _ = _decode(self._carry, final=True)
        self._carry = b""
        self._screen.feed(text, final=True)
        lines, _ = self._screen.finish()
        rest = lines[self._emitted :]
        self._emitted = len(lines)
        return shown("\n".join(rest))
