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

from supervisor.core.text import utf8_safe_end
from supervisor.core.visible import visible

#: Lines the cursor can move back into; lines scrolled above them are final.
SCREEN_LINES = 50
#: Longest escape sequence held back at a chunk's end (a longer one is not a sequence).
MAX_SEQUENCE = 4096
#: What a collapsed run of identical lines shows after the line.
REPEAT_MARK = "[… repeated {n} times]"
#: A run of identical lines collapses only from this length on.
MIN_REPEAT = 3

_SPECIAL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")
_CSI = re.compile(r"\x1b\[([0-?]*)([ -/]*)([@-~])")
_STRING = re.compile(r"\x1b[\]PX^_][^\x07\x1b\n]*(?:\x07|\x1b\\)")
_ESC = re.compile(r"\x1b[ -/]*[0-~]")
_PARTIAL = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|[\]PX^_][^\x07\x1b\n]*\x1b?|[ -/]*)\Z")
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


class _Screen:
    """The state machine: committed lines, the editable region, the cursor."""

    __slots__ = (
        "_ascii",
        "_bpos",
        "_count",
        "_cpos",
        "_held",
        "_held_origins",
        "_text",
        "col",
        "height",
        "lines",
        "origins",
        "out",
        "out_origins",
        "row",
        "rows",
        "saved",
        "status",
        "status_at",
    )

    def __init__(self, height: int = SCREEN_LINES, base: int = 0) -> None:
        self.height = max(1, height)
        self.lines: list[str] = [""]
        #: Input byte offset where each region line began.
        self.origins: list[int] = [base]
        self.row = 0
        self.col = 0
        self.saved = (0, 0)
        #: The bottom of the scroll region (``ESC[t;br``), None when there is none.
        self.rows: int | None = None
        #: Status rows below the scroll region (apt's progress bar), by terminal row; the
        #: cursor is on ``status_at`` while something draws there.
        self.status: dict[int, str] = {}
        self.status_at: int | None = None
        #: Final lines (collapsed), and where each began.
        self.out: list[str] = []
        self.out_origins: list[int] = []
        self._held: str | None = None
        self._held_origins: list[int] = []
        self._count = 0
        # Byte offset of character ``_cpos`` of the text being fed.
        self._text = ""
        self._ascii = True
        self._cpos = 0
        self._bpos = base

    # -- offsets ---------------------------------------------------------------------

    def _byte_at(self, i: int) -> int:
        if self._ascii:
            return self._bpos + i - self._cpos
        if i != self._cpos:
            self._bpos += len(self._text[self._cpos : i].encode("utf-8", "surrogateescape"))
            self._cpos = i
        return self._bpos

    # -- final lines -----------------------------------------------------------------

    def _emit(self, line: str, origin: int) -> None:
        if line == self._held:
            self._count += 1
            if len(self._held_origins) < 64:
                self._held_origins.append(origin)
            return
        self._release()
        self._held, self._held_origins, self._count = line, [origin], 1

    def _release(self) -> None:
        held, n = self._held, self._count
        if held is None:
            return
        mark = REPEAT_MARK.format(n=n)
        if n >= MIN_REPEAT and len(mark) < (n - 1) * (len(held) + 1):
            self.out += (held, mark)
            self.out_origins += (self._held_origins[0], self._held_origins[0])
        else:
            self.out += [held] * n
            self.out_origins += self._held_origins[:n]
        self._held, self._held_origins, self._count = None, [], 0

    def _commit(self, n: int) -> None:
        for line, origin in zip(self.lines[:n], self.origins[:n], strict=True):
            self._emit(line, origin)
        del self.lines[:n], self.origins[:n]
        self.row -= n
        self.saved = (max(0, self.saved[0] - n), self.saved[1])

    def _visible_lines(self) -> int:
        """Region lines shown: the trailing empty ones below the cursor are not."""
        n = len(self.lines)
        while n > self.row + 1 and not self.lines[n - 1]:
            n -= 1
        return n

    def finish(self) -> tuple[list[str], list[int]]:
        """Everything, as final lines (the screen is committed)."""
        n = self._visible_lines()
        del self.lines[n:], self.origins[n:]
        for row in sorted(self.status):
            if self.status[row]:  # still shown: the command ended while drawing it
                self.lines.append(self.status[row])
                self.origins.append(self._bpos)
        self.status, self.status_at = {}, None
        self._commit(len(self.lines))
        self._release()
        self.lines, self.origins, self.row, self.col = [""], [self._bpos], 0, 0
        return self.out, self.out_origins

    # -- the cursor ------------------------------------------------------------------

    def _put(self, run: str) -> None:
        if self.status_at is not None:
            line = self.status.get(self.status_at, "")
            col = self.col
            line = line.ljust(col)[:col] + run + line[col + len(run) :]
            self.status[self.status_at] = line
            self.col = col + len(run)
            return
        line, col = self.lines[self.row], self.col
        if col == len(line):
            line += run
        elif col > len(line):
            line += " " * (col - len(line)) + run
        else:
            line = line[:col] + run + line[col + len(run) :]
        self.lines[self.row] = line
        self.col = col + len(run)

    def _down(self, origin: int, *, scroll: bool = True) -> None:
        self.row += 1
        if self.row == len(self.lines):
            if not scroll:
                self.row -= 1
                return
            self.lines.append("")
            self.origins.append(origin)
            if len(self.lines) > self.height:
                self._commit(1)

    def _screen_row(self, row: int) -> int:
        """Region index of the terminal's row ``row`` (0-based): counted from the region's
        top, or, within a scroll region shorter than the editable region, from where that
        many lines above its bottom begin."""
        if self.rows is not None and len(self.lines) > self.rows:
            return len(self.lines) - self.rows + row
        return row

    def _goto_row(self, row: int, origin: int) -> None:
        row = max(0, min(row, self.height - 1))
        while len(self.lines) <= row:
            self.lines.append("")
            self.origins.append(origin)
        self.row = row

    def _clear(self, origin: int) -> None:
        """Erase the display: what it showed stays above, as in a terminal's scrollback."""
        row, col = self.row, self.col
        n = self._visible_lines()
        del self.lines[n:], self.origins[n:]
        self._commit(len(self.lines))
        self.lines, self.origins = [""] * (row + 1), [origin] * (row + 1)
        self.row, self.col = row, col

    # -- feeding ---------------------------------------------------------------------

    def feed(self, text: str, *, final: bool) -> int:
        """Interpret ``text``; returns how many characters were (the rest starts an
        incomplete escape sequence, only when not ``final``)."""
        self._text, self._ascii, self._cpos = text, text.isascii(), 0
        n = len(text)
        pos = 0
        while pos < n:
            m = _SPECIAL.search(text, pos)
            stop = m.start() if m else n
            if stop > pos:
                self._plain(text, pos, stop)
            if m is None:
                break
            ch = text[stop]
            if ch == "\r":
                self.col = 0
                pos = stop + 1
            elif ch == "\b":
                self.col = max(0, self.col - 1)
                pos = stop + 1
            elif ch == "\x1b":
                end = self._escape(text, stop, final)
                if end < 0:
                    self._finish_text(stop)
                    return stop
                pos = end
            else:
                self._put(ch)
                pos = stop + 1
        self._finish_text(n)
        return n

    def _finish_text(self, i: int) -> None:
        self._bpos = self._byte_at(i)
        self._cpos, self._text, self._ascii = 0, "", True

    def _plain(self, text: str, a: int, b: int) -> None:
        """Printable text and newlines ``text[a:b]``."""
        nl = text.find("\n", a, b)
        if nl < 0:
            self._put(text[a:b])
            return
        if nl > a:
            self._put(text[a:nl])
        while nl >= 0:
            self._down(self._byte_at(nl + 1))
            self.col = 0
            start = nl + 1
            nl = text.find("\n", start, b)
            piece = text[start : b if nl < 0 else nl]
            if piece:
                self._put(piece)

    def _escape(self, text: str, i: int, final: bool) -> int:
        """Handle the sequence at ``text[i]`` (ESC); where it ends, -1 if incomplete."""
        nxt = text[i + 1 : i + 2]
        if nxt == "[":
            m = _CSI.match(text, i)
        elif nxt and nxt in "]PX^_":
            m = _STRING.match(text, i)
        else:
            m = _ESC.match(text, i)
        if m is None:
            if not final and len(text) - i <= MAX_SEQUENCE and _PARTIAL.match(text, i):
                return -1
            self._put("\x1b")  # not a sequence: shown (as \x1b)
            return i + 1
        if nxt == "[":
            self._csi(m.group(1), m.group(2), m.group(3), self._byte_at(m.end()))
        elif m.end() - i == 2:
            self._esc(nxt, self._byte_at(m.end()))
        return m.end()

    def _esc(self, code: str, origin: int) -> None:
        if code == "7":
            self.saved = (self.row, self.col)
        elif code == "8":
            self.status_at = None
            self._goto_row(self.saved[0], origin)
            self.col = self.saved[1]
        elif code == "M":
            self.row = max(0, self.row - 1)
        elif code == "D":
            col = self.col
            self._down(origin)
            self.col = col
        elif code == "E":
            self._down(origin)
            self.col = 0
        elif code == "c":
            self._clear(origin)
            self.row = self.col = 0

    def _csi(self, params: str, inter: str, final: str, origin: int) -> None:
        if inter or (params and params[0] in "<=>?"):
            return  # private modes, cursor styles, ...: nothing a reader sees
        if final == "m":
            return
        try:
            args = [int(p) if p else 0 for p in params.split(";")]
        except ValueError:
            return
        first = args[0]
        n = max(1, first)
        if self.status_at is not None and final in "KJ":
            line = self.status.get(self.status_at, "")
            self.status[self.status_at] = line[: self.col] if first == 0 else ""
            return
        if final == "A":
            self.row = max(0, self.row - n)
        elif final in "Be":
            self.row = min(len(self.lines) - 1, self.row + n)
        elif final in "Ca":
            self.col += n
        elif final == "D":
            self.col = max(0, self.col - n)
        elif final == "E":
            self.row, self.col = min(len(self.lines) - 1, self.row + n), 0
        elif final == "F":
            self.row, self.col = max(0, self.row - n), 0
        elif final in "G`":
            self.col = n - 1
        elif final in "Hf":
            col = args[1] if len(args) > 1 else 0
            self.col = max(1, col) - 1
            if self.rows is not None and n > self.rows:
                self.status_at = n  # below the scroll region: a status row
                return
            self.status_at = None
            self._goto_row(self._screen_row(n - 1), origin)
        elif final == "d":
            self._goto_row(self._screen_row(n - 1), origin)
        elif final == "r":
            # A scroll region: rows below its bottom are status rows, outside the log. Set
            # back to a taller one (or reset), they rejoin it, and the command erases them.
            bottom = args[1] if len(args) > 1 else 0
            if bottom > 1 and (self.rows is None or bottom <= self.rows):
                self.rows = bottom
            else:
                self.rows, self.status, self.status_at = None, {}, None
        elif final == "K":
            line = self.lines[self.row]
            if first == 0:
                self.lines[self.row] = line[: self.col]
            elif first == 1:
                self.lines[self.row] = " " * (self.col + 1) + line[self.col + 1 :]
            elif first == 2:
                self.lines[self.row] = ""
        elif final == "J":
            if first == 0:
                self.lines[self.row] = self.lines[self.row][: self.col]
                del self.lines[self.row + 1 :], self.origins[self.row + 1 :]
            elif first == 1:
                for r in range(self.row):
                    self.lines[r] = ""
                line = self.lines[self.row]
                self.lines[self.row] = " " * (self.col + 1) + line[self.col + 1 :]
            elif first in (2, 3):
                self._clear(origin)
        elif final == "P":
            line = self.lines[self.row]
            self.lines[self.row] = line[: self.col] + line[self.col + n :]
        elif final == "X":
            line = self.lines[self.row]
            if self.col < len(line):
                self.lines[self.row] = line[: self.col] + " " * n + line[self.col + n :]
        elif final == "@":
            line = self.lines[self.row]
            if self.col < len(line):
                self.lines[self.row] = line[: self.col] + " " * n + line[self.col :]
        elif final == "L":
            self.lines[self.row : self.row] = [""] * n
            self.origins[self.row : self.row] = [origin] * n
            if len(self.lines) > self.height:
                del self.lines[self.height :], self.origins[self.height :]
        elif final == "M":
            del self.lines[self.row : self.row + n], self.origins[self.row : self.row + n]
            if not self.lines:
                self.lines, self.origins = [""], [origin]
            self.row = min(self.row, len(self.lines) - 1)
        elif final == "s":
            self.saved = (self.row, self.col)
        elif final == "u":
            self.status_at = None
            self._goto_row(self.saved[0], origin)
            self.col = self.saved[1]


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
    screen = _Screen(base=base)
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
    screen = _Screen()
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
        self._screen = _Screen(height)
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
