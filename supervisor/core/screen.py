"""Pure: the terminal state machine behind ``core.terminal`` (see its docstring): final
lines, the editable region of the last lines, the cursor, and the sequences that move it."""

from __future__ import annotations

import re

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


class Screen:
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

    def down(self, origin: int, *, scroll: bool = True) -> None:
        self.row += 1
        if self.row == len(self.lines):
            if not scroll:
                self.row -= 1
                return
            self.lines.append("")
            self.origins.append(origin)
            if len(self.lines) > self.height:
                self._commit(1)

    def screen_row(self, row: int) -> int:
        """Region index of the terminal's row ``row`` (0-based): counted from the region's
        top, or, within a scroll region shorter than the editable region, from where that
        many lines above its bottom begin."""
        if self.rows is not None and len(self.lines) > self.rows:
            return len(self.lines) - self.rows + row
        return row

    def save_cursor(self) -> None:
        """``ESC 7`` / ``CSI s``."""
        self.saved = (self.row, self.col)

    def restore_cursor(self, origin: int) -> None:
        """``ESC 8`` / ``CSI u``: back where ``save_cursor`` was (out of a status row)."""
        self.status_at = None
        self.goto_row(self.saved[0], origin)
        self.col = self.saved[1]

    def goto_row(self, row: int, origin: int) -> None:
        row = max(0, min(row, self.height - 1))
        while len(self.lines) <= row:
            self.lines.append("")
            self.origins.append(origin)
        self.row = row

    def clear(self, origin: int) -> None:
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
            self.down(self._byte_at(nl + 1))
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
            apply_csi(self, m.group(1), m.group(2), m.group(3), self._byte_at(m.end()))
        elif m.end() - i == 2:
            apply_esc(self, nxt, self._byte_at(m.end()))
        return m.end()


def apply_esc(screen: Screen, code: str, origin: int) -> None:
    """A two-character escape (``ESC 7``, ``ESC 8``, ``ESC M``, ...)."""
    if code == "7":
        screen.save_cursor()
    elif code == "8":
        screen.restore_cursor(origin)
    elif code == "M":
        screen.row = max(0, screen.row - 1)
    elif code == "D":
        col = screen.col
        screen.down(origin)
        screen.col = col
    elif code == "E":
        screen.down(origin)
        screen.col = 0
    elif code == "c":
        screen.clear(origin)
        screen.row = screen.col = 0


def apply_csi(screen: Screen, params: str, inter: str, final: str, origin: int) -> None:
    """A CSI sequence: cursor movement, erasing, insert/delete, scroll region."""
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
    if screen.status_at is not None and final in "KJ":
        line = screen.status.get(screen.status_at, "")
        screen.status[screen.status_at] = line[: screen.col] if first == 0 else ""
        return
    if final == "A":
        screen.row = max(0, screen.row - n)
    elif final in "Be":
        screen.row = min(len(screen.lines) - 1, screen.row + n)
    elif final in "Ca":
        screen.col += n
    elif final == "D":
        screen.col = max(0, screen.col - n)
    elif final == "E":
        screen.row, screen.col = min(len(screen.lines) - 1, screen.row + n), 0
    elif final == "F":
        screen.row, screen.col = max(0, screen.row - n), 0
    elif final in "G`":
        screen.col = n - 1
    elif final in "Hf":
        col = args[1] if len(args) > 1 else 0
        screen.col = max(1, col) - 1
        if screen.rows is not None and n > screen.rows:
            screen.status_at = n  # below the scroll region: a status row
            return
        screen.status_at = None
        screen.goto_row(screen.screen_row(n - 1), origin)
    elif final == "d":
        screen.goto_row(screen.screen_row(n - 1), origin)
    elif final == "r":
        # A scroll region: rows below its bottom are status rows, outside the log. Set
        # back to a taller one (or reset), they rejoin it, and the command erases them.
        bottom = args[1] if len(args) > 1 else 0
        if bottom > 1 and (screen.rows is None or bottom <= screen.rows):
            screen.rows = bottom
        else:
            screen.rows, screen.status, screen.status_at = None, {}, None
    elif final == "K":
        line = screen.lines[screen.row]
        if first == 0:
            screen.lines[screen.row] = line[: screen.col]
        elif first == 1:
            screen.lines[screen.row] = " " * (screen.col + 1) + line[screen.col + 1 :]
        elif first == 2:
            screen.lines[screen.row] = ""
    elif final == "J":
        if first == 0:
            screen.lines[screen.row] = screen.lines[screen.row][: screen.col]
            del screen.lines[screen.row + 1 :], screen.origins[screen.row + 1 :]
        elif first == 1:
            for r in range(screen.row):
                screen.lines[r] = ""
            line = screen.lines[screen.row]
            screen.lines[screen.row] = " " * (screen.col + 1) + line[screen.col + 1 :]
        elif first in (2, 3):
            screen.clear(origin)
    elif final == "P":
        line = screen.lines[screen.row]
        screen.lines[screen.row] = line[: screen.col] + line[screen.col + n :]
    elif final == "X":
        line = screen.lines[screen.row]
        if screen.col < len(line):
            screen.lines[screen.row] = line[: screen.col] + " " * n + line[screen.col + n :]
    elif final == "@":
        line = screen.lines[screen.row]
        if screen.col < len(line):
            screen.lines[screen.row] = line[: screen.col] + " " * n + line[screen.col :]
    elif final == "L":
        screen.lines[screen.row : screen.row] = [""] * n
        screen.origins[screen.row : screen.row] = [origin] * n
        if len(screen.lines) > screen.height:
            del screen.lines[screen.height :], screen.origins[screen.height :]
    elif final == "M":
        del screen.lines[screen.row : screen.row + n], screen.origins[screen.row : screen.row + n]
        if not screen.lines:
            screen.lines, screen.origins = [""], [origin]
        screen.row = min(screen.row, len(screen.lines) - 1)
    elif final == "s":
        screen.save_cursor()
    elif final == "u":
        screen.restore_cursor(origin)
