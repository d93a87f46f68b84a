"""Pure: match output lines against a pattern in linear time (RE2), fed in chunks of any size.

Why RE2: ``re.search`` backtracks, so ``(a+)+$`` over 30 characters takes seconds, and a
hostile pattern can pin whatever thread runs it. RE2 runs in time linear in the text and
releases the GIL while it searches, so a worker thread can scan while the loop serves.

Line semantics (``wait_for``): the output is split at ``\\n``; each line is searched on its
own, so ``^`` and ``$`` (and ``\\A``, ``\\z``, ``\\Z``) anchor at the line's start and end and
no match spans two lines. Bytes that are not valid UTF-8 count as one ``?`` each. A line
longer than the scan window (1 MiB) is searched in windows of that size starting every half
window: a match up to half a window long is found anywhere in the line; the reported
``line`` is then the window that matched and ``offset`` where that window starts.

A line also matches when it matches as a terminal shows it (``core.terminal``), so ``ok``
matches ``\\x1b[32mok\\x1b[0m`` and ``100%`` the last frame of a ``\\r`` progress bar: a
line holding ESC, ``\\r`` or ``\\b`` (and no longer than the window) is searched rendered
too. The reported ``line`` and ``offset`` are still the raw line's.

Syntax: RE2's, which is Python's for everyday patterns (``^ready$``, ``\\d+``, ``(?i)error``,
classes, groups, ``(?P<name>...)``, ``{n,m}``, ``{,n}``). Refused with a ``SpecError``:
backreferences, lookahead/lookbehind, atomic groups, possessive quantifiers, conditionals,
comments and the ``(?x)``/``(?a)``/``(?u)``/``(?L)`` flags; ``\\C``; counted repetition beyond
1000. Unlike Python's bytes patterns, ``.`` and classes match whole characters (``[é]`` is
one character) and ``(?i)`` folds non-ASCII letters too; ``\\d``, ``\\w``, ``\\s``, ``\\b``
stay ASCII, as in Python's bytes patterns.
"""

from __future__ import annotations

import re
from typing import Protocol, cast

import re2

from supervisor.core.errors import SpecError
from supervisor.core.models import PatternMatch
from supervisor.core.terminal import render

#: Longest pattern accepted, in characters.
MAX_PATTERN_CHARS = 10_000
#: RE2 memory budget per compiled pattern (program plus DFA cache); a pattern whose program
#: alone does not fit is refused. The search falls back to RE2's slower (still linear) NFA
#: when the DFA cache overflows, so memory never grows past this.
PATTERN_MAX_MEM = 8 << 20
#: Longest stretch of one line searched at once; longer lines are searched in windows.
DEFAULT_WINDOW = 1 << 20
#: UTF-8 is self-synchronising within 3 bytes: 4 bytes of context on each side of a window
#: make its bytes (and the neighbours assertions look at) read as they do in the whole line.
_MARGIN = 4
#: Largest piece of a feed handled in one go (see ``LineScanner.feed``).
_SLICE = 1 << 20
#: Flag groups that switch multi-line mode off: harmless on one line, but the chunk search
#: relies on ``(?m)``, so the ``m`` is dropped from them.
_FLAGS_OFF_M = re.compile(r"\(\?([imsU]*)-([imsU]*)([:)])")
_UP_TO = re.compile(r"\{,(\d+)\}")
#: Bytes that make a line read differently on a terminal (escape sequences, overwrites).
_DRAWN = re.compile(rb"[\x1b\r\x08]")


class _Compiled(Protocol):
    """The slice of ``re2._re2.RE2`` used here (the binding has no type stubs)."""

    def Match(  # the binding's name
        self, anchor: object, text: bytes | bytearray | memoryview, pos: int, endpos: int
    ) -> list[tuple[int, int]]: ...


# The binding is used directly (not ``re2.compile``): the module-level cache would keep up to
# 128 compiled patterns, each with its own DFA budget, alive for the life of the process.
_RE2 = re2._re2.RE2
_UNANCHORED = _RE2.Anchor.UNANCHORED


class Pattern:
    """A compiled, linear-time line pattern (see the module docstring for its syntax)."""

    __slots__ = ("_re", "pattern")

    def __init__(self, pattern: str, compiled: _Compiled) -> None:
        self.pattern = pattern
        """The pattern as given."""
        self._re = compiled

    def __repr__(self) -> str:
        return f"Pattern({self.pattern!r})"

    def matches(self, line: str | bytes) -> bool:
        """True when ``line`` matches (a text holding several lines: when any of them does).

        The whole line is searched, however long (in linear time); a ``str`` with lone
        surrogates, like bytes that are not UTF-8, counts each bad unit as ``?``."""
        raw = line.encode("utf-8", "replace") if isinstance(line, str) else _clean(line)
        return self._search(raw, 0, len(raw)) >= 0

    def _search(self, text: bytes | memoryview, pos: int, endpos: int) -> int:
        """Start of the first match within ``text[pos:endpos]`` (assertions see all of
        ``text``), or -1."""
        return self._re.Match(_UNANCHORED, text, pos, endpos)[0][0]


def compile_pattern(pattern: str) -> Pattern:
    """Compile a ``wait_for`` / output filter pattern; SpecError (field ``pattern``) if refused."""
    if len(pattern) > MAX_PATTERN_CHARS:
        raise SpecError(f"pattern: longer than {MAX_PATTERN_CHARS} characters (got {len(pattern)})")
    try:
        source = _rewrite(pattern).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SpecError("pattern: contains a lone surrogate (not valid UTF-8)") from exc
    except _Refused as exc:
        raise SpecError(f"pattern: {exc} ({_SYNTAX})") from exc
    options = re2.Options()
    options.never_nl = True  # a match never spans lines, so whole chunks can be searched
    options.log_errors = False  # RE2 would print every refused pattern to stderr
    options.max_mem = PATTERN_MAX_MEM
    compiled = _RE2(source, options)
    if not compiled.ok():
        error = compiled.error()
        detail = error.decode("utf-8", "replace") if isinstance(error, bytes) else str(error)
        if "pattern too large" in detail:
            raise SpecError(
                f"pattern: too large: its compiled form exceeds {PATTERN_MAX_MEM >> 20} MiB "
                "(use fewer or smaller counted repetitions {n,m}, or narrower classes)"
            )
        if "invalid repetition size" in detail:
            raise SpecError(
                f"pattern: counted repetition is limited to 1000, nested counts multiplied "
                f"({detail})"
            )
        why = _unsupported(detail, pattern)
        if why is None:
            raise SpecError(f"pattern: not a valid regular expression ({detail})")
        raise SpecError(f"pattern: {why} ({_SYNTAX})")
    return Pattern(pattern, cast(_Compiled, compiled))


_SYNTAX = (
    "patterns run in linear time (RE2): Python's syntax without backreferences, "
    "lookaround, atomic groups, possessive quantifiers, conditionals, comments, \\C or "
    "flags other than i, m, s, U"
)


class _Refused(ValueError):
    """A construct refused before RE2 sees it."""


def _unsupported(error: str, pattern: str) -> str | None:
    """Which feature RE2 lacks made it refuse a pattern (None: a plain syntax error)."""
    if re.search(r"invalid escape sequence: \\[1-9]", error) or "(?P=" in pattern:
        return "backreferences are not supported"
    if any(op in error for op in ("(?=", "(?!", "(?<=", "(?<!")):
        return "lookahead and lookbehind are not supported"
    if "(?>" in error:
        return "atomic groups are not supported"
    if "(?(" in error:
        return "conditionals are not supported"
    if "(?#" in error:
        return "comments are not supported"
    if "bad repetition operator" in error:
        return "possessive quantifiers (a++, a*+, a?+) are not supported"
    if re.search(r"\(\?[a-zA-Z]*[axuLX]", error):
        return "only the flags i, m, s and U are supported"
    return None


def _rewrite(pattern: str) -> str:
    """The pattern with ``(?m)`` on: every line anchor becomes ``^``/``$``, so one search over
    many lines means the same as one search per line."""
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    class_body = 0  # where the open class's body starts: a ']' there is a literal
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt == "Q":  # \Q...\E: literal text, copied untouched
                end = pattern.find("\\E", i + 2)
                end = n if end < 0 else end + 2
                out.append(pattern[i:end])
                i = end
                continue
            if nxt == "C":
                raise _Refused("\\C (any single byte) is not supported")
            if not in_class and nxt in ("A", "z", "Z"):
                out.append("^" if nxt == "A" else "$")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "[" and pattern.startswith("[:", i):
                end = pattern.find(":]", i + 2)
                if end >= 0:
                    out.append(pattern[i : end + 2])
                    i = end + 2
                    continue
            elif c == "]" and i > class_body:
                in_class = False
        elif c == "[":
            in_class = True
            class_body = i + (2 if pattern.startswith("^", i + 1) else 1)
        elif c == "{" and (upto := _UP_TO.match(pattern, i)) is not None:
            out.append("{0," + upto.group(1) + "}")  # Python's {,n}; RE2 reads it literally
            i = upto.end()
            continue
        elif c == "(":
            group = _FLAGS_OFF_M.match(pattern, i)
            if group is not None and "m" in group.group(2):
                off = group.group(2).replace("m", "")
                kept = "(?" + group.group(1) + ("-" + off if off else "") + group.group(3)
                out.append("" if kept == "(?)" else kept)
                i = group.end()
                continue
        out.append(c)
        i += 1
    return "(?m)" + "".join(out)


def _clean(raw: bytes | bytearray | memoryview) -> bytes:
    """``raw`` with each byte that is not valid UTF-8 replaced by ``?`` (same length, so
    offsets carry over; RE2 would otherwise let nothing match such a byte)."""
    data = bytes(raw)
    if data.isascii():
        return data
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        # Both steps are C fast paths: each bad byte becomes one surrogate, then one '?'.
        return data.decode("utf-8", "surrogateescape").encode("utf-8", "replace")
    return data


class LineScanner:
    """Feed a task's output in order, in chunks of any size; get the first matching line.

    Each byte is searched at most twice (long lines' windows overlap by half) and at most
    one window of the current line is held, so a 300 MB line costs 1 MiB of memory."""

    def __init__(
        self, pattern: Pattern, from_offset: int = 0, *, window: int = DEFAULT_WINDOW
    ) -> None:
        if window < 16 or window % 2:
            raise ValueError(f"window must be an even number >= 16 (got {window})")
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0 (got {from_offset})")
        self.pattern = pattern
        self._window = window
        self._step = window // 2
        self._pos = from_offset
        #: File offset of the current (unfinished) line's first byte.
        self._line = from_offset
        #: Bytes of the current line from line position ``_base`` on.
        self._buf = bytearray()
        self._base = 0
        #: Next window of the current line to search.
        self._k = 0
        self._finished = False
        self.match: PatternMatch | None = None
        """The first match, once found (later input is ignored)."""

    @property
    def position(self) -> int:
        """File offset the next ``feed`` must start at."""
        return self._pos

    @property
    def held(self) -> int:
        """Bytes of the current line held between feeds (bounded by the window)."""
        return len(self._buf)

    def feed(self, data: bytes, offset: int) -> PatternMatch | None:
        """Scan ``data``, which starts at file ``offset`` (where the last feed ended)."""
        if self._finished:
            raise ValueError("feed after finish")
        if offset != self._pos:
            raise ValueError(f"feed at offset {offset}, expected {self._pos}")
        self._pos += len(data)
        if self.match is not None:
            return self.match
        if len(data) <= _SLICE:
            return self._feed(data, offset)
        # Slices bound how long one C call (UTF-8 checks, copies) holds the GIL, so the
        # event loop keeps turning while a worker thread scans; the result is the same.
        for start in range(0, len(data), _SLICE):
            found = self._feed(data[start : start + _SLICE], offset + start)
            if found is not None:
                return found
        return None

    def _feed(self, data: bytes, offset: int) -> PatternMatch | None:
        first = data.find(b"\n")
        if first < 0:
            return self._extend(data, ends=False)
        view = memoryview(data)
        found = self._extend(view[:first], ends=True)
        if found is not None:
            return found
        last = data.rfind(b"\n")
        if last > first:
            found = self._lines(data, first + 1, last, offset)
            if found is not None:
                return found
        self._line = offset + last + 1
        return self._extend(view[last + 1 :], ends=False)

    def finish(self) -> PatternMatch | None:
        """The output ended: search its last line if it has no newline."""
        if self._finished or self.match is not None:
            self._finished = True
            return self.match
        self._finished = True
        if self._base + len(self._buf) == 0:
            return None
        return self._extend(b"", ends=True)

    # -- the current line, buffered across feeds --------------------------------------

    def _extend(self, piece: bytes | memoryview, *, ends: bool) -> PatternMatch | None:
        """Add ``piece`` to the current line and search every window now complete."""
        self._buf += piece
        size = self._base + len(self._buf)
        found = None
        while True:
            start = self._k * self._step
            end = start + self._window
            last = ends and end >= size
            if ends:
                end = min(end, size)
            elif end + _MARGIN > size:
                break  # not complete yet: its last bytes' neighbours are still to come
            found = self._search_buffered(start, end, size)
            self._k += 1
            if found is not None or last:
                break
        if found is None and ends and self._base == 0 and size <= self._window:
            found = self._rendered(self._buf, 0, size, self._line)
        if ends:
            self._line += size + 1
            self._buf.clear()
            self._base = self._k = 0
        else:
            keep = max(0, self._k * self._step - _MARGIN)
            del self._buf[: keep - self._base]
            self._base = keep
        return found

    def _search_buffered(self, start: int, end: int, size: int) -> PatternMatch | None:
        lo = max(0, start - _MARGIN)
        hi = min(size, end + _MARGIN)
        # One copy through a view (slicing the bytearray would copy twice); the view must
        # be released before the buffer is resized again.
        with memoryview(self._buf) as view:
            text = _clean(view[lo - self._base : hi - self._base])
        if self.pattern._search(text, start - lo, end - lo) < 0:
            return None
        return self._found(self._buf[start - self._base : end - self._base], self._line + start)

    # -- whole lines inside one chunk ------------------------------------------------

    def _rendered(
        self, data: bytes | bytearray, start: int, end: int, offset: int
    ) -> PatternMatch | None:
        """The line ``data[start:end]`` (file ``offset``) if it has terminal sequences or
        overwrites and matches as a terminal shows it."""
        if end - start > self._window or not _DRAWN.search(data, start, end):
            return None
        if not self.pattern.matches(render(bytes(data[start:end])).text):
            return None
        return self._found(data[start:end], offset)

    def _lines(self, data: bytes, a: int, b: int, offset: int) -> PatternMatch | None:
        """Search the complete lines ``data[a:b]`` (``data[b]`` is their last newline): the
        first line that matches as printed or as rendered."""
        pos = a
        while (drawn := _DRAWN.search(data, pos, b)) is not None:
            start = data.rfind(b"\n", a, drawn.start()) + 1 or a
            end = data.find(b"\n", drawn.start(), b + 1)
            rendered = self._rendered_quiet(data, start, end)
            if rendered:
                # An earlier line may match as printed: search those first.
                found = self._raw_lines(data, a, start - 1, offset) if start > a else None
                return found or self._found(data[start:end], offset + start)
            pos = end + 1
        return self._raw_lines(data, a, b, offset)

    def _rendered_quiet(self, data: bytes, start: int, end: int) -> bool:
        """Whether the line ``data[start:end]`` matches as a terminal shows it."""
        return end - start <= self._window and self.pattern.matches(render(data[start:end]).text)

    def _raw_lines(self, data: bytes, a: int, b: int, offset: int) -> PatternMatch | None:
        """Search the complete lines ``data[a:b]`` (``data[b]`` is their last newline) with
        one RE2 search per match candidate, not one per line."""
        text = _clean(data)
        pos = a
        while pos <= b:
            hit = self.pattern._search(text, pos, b)
            if hit < 0:
                return None
            nl = text.rfind(b"\n", pos, hit)
            start = pos if nl < 0 else nl + 1
            end = text.find(b"\n", hit)
            if end - start <= self._window:
                return self._found(data[start:end], offset + start)
            found = self._long_line(text, data, start, end, offset)
            if found is not None:
                return found
            pos = end + 1  # its match was longer than the windows reach
        return None

    def _long_line(
        self, text: bytes, data: bytes, start: int, end: int, offset: int
    ) -> PatternMatch | None:
        size = end - start
        k = 0
        while True:
            lo = start + k * self._step
            hi = min(lo + self._window, end)
            if self.pattern._search(text, lo, hi) >= 0:
                return self._found(data[lo:hi], offset + lo)
            if hi >= end or k * self._step + self._window >= size:
                return None
            k += 1

    def _found(self, raw: bytes | bytearray | memoryview, offset: int) -> PatternMatch:
        self.match = PatternMatch(line=bytes(raw).decode("utf-8", "replace"), offset=offset)
        return self.match
