"""gitignore semantics in pure Python, as ``git check-ignore --no-index`` decides.

Pattern files parsed like git's dir.c, git's wildmatch translated to linear-time RE2
expressions (a hostile ``.gitignore`` cannot make a listing slow), the last matching
pattern wins, and nothing below an ignored directory can be re-included.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import re2

_RE2 = re2._re2.RE2
_BOTH = _RE2.Anchor.ANCHOR_BOTH
#: RE2's memory budget for one combined expression (its default is 8 MiB).
_MAX_MEM = 64 << 20

_CLASSES: dict[bytes, frozenset[int]] = {
    b"alnum": frozenset(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
    b"alpha": frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
    b"blank": frozenset(b" \t"),
    b"cntrl": frozenset([*range(32), 127]),
    b"digit": frozenset(b"0123456789"),
    b"graph": frozenset(range(33, 127)),
    b"lower": frozenset(b"abcdefghijklmnopqrstuvwxyz"),
    b"print": frozenset(range(32, 127)),
    b"punct": frozenset(c for c in range(33, 127) if not chr(c).isalnum()),
    b"space": frozenset(b" \t\n\v\f\r"),
    b"upper": frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    b"xdigit": frozenset(b"0123456789ABCDEFabcdef"),
}
_SLASH = ord("/")


class _Compiled(Protocol):
    def Match(  # the binding's name
        self, anchor: object, text: bytes, pos: int, endpos: int
    ) -> list[tuple[int, int]]: ...


def _compile(source: bytes) -> _Compiled | None:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1  # 8-bit clean: names need not be UTF-8
    options.never_capture = True
    options.log_errors = False
    options.max_mem = _MAX_MEM
    compiled = _RE2(b"(?s)" + source, options)
    return cast(_Compiled, compiled) if compiled.ok() else None


def _fullmatch(rx: _Compiled, text: bytes) -> bool:
    return rx.Match(_BOTH, text, 0, len(text))[0][0] >= 0


def _lit(byte: int) -> bytes:
    return b"\\x%02x" % byte


def _class(members: set[int]) -> bytes:
    out = bytearray(b"[")
    run: list[int] = []
    for c in [*sorted(members), -2]:
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out += _lit(run[0]) + (b"-" + _lit(run[-1]) if len(run) > 1 else b"")
        run = [c]
    return bytes(out + b"]")


def _bracket(pat: bytes, i: int) -> tuple[bytes | None, int]:
    """Translate the class starting at ``pat[i] == '['``: (RE2 class, or None when the
    class makes the pattern unmatchable, index after it); (None, -1) aborts the pattern."""
    n = len(pat)
    j = i + 1
    if j >= n:
        return None, -1
    ch = pat[j]
    negated = ch in b"!^"
    if negated:
        j += 1
        if j >= n:
            return None, -1
        ch = pat[j]
    members: set[int] = set()
    prev = 0
    while True:
        if ch == ord("\\"):
            j += 1
            if j >= n:
                return None, -1
            ch = pat[j]
            members.add(ch)
        elif ch == ord("-") and prev and j + 1 < n and pat[j + 1] != ord("]"):
            j += 1
            ch = pat[j]
            if ch == ord("\\"):
                j += 1
                if j >= n:
                    return None, -1
                ch = pat[j]
            members.update(range(prev, ch + 1))
            ch = 0  # a range is never the start of another
        elif ch == ord("[") and j + 1 < n and pat[j + 1] == ord(":"):
            start = j + 2
            k = start
            while k < n and pat[k] != ord("]"):
                k += 1
            if k >= n:
                return None, -1
            if k - start - 1 < 0 or pat[k - 1] != ord(":"):
                # No ":]": the '[' is a plain member and scanning resumes after it.
                members.add(ch)
            else:
                cls = _CLASSES.get(pat[start : k - 1])
                if cls is None:
                    return None, -1
                members.update(cls)
                j = k
                ch = 0
        else:
            members.add(ch)
        prev = ch
        j += 1
        if j >= n:
            return None, -1
        ch = pat[j]
        if ch == ord("]"):
            break
    chosen = (set(range(256)) - members) if negated else members
    chosen.discard(_SLASH)  # with WM_PATHNAME a class never matches '/'
    return (_class(chosen) if chosen else None), j + 1


#: The characters that end a pattern's literal prefix (git's ``is_glob_special``).
_GLOB_SPECIAL = frozenset(b"*?[\\")


def literal_prefix(pat: bytes) -> int:
    """How many leading bytes of ``pat`` hold no wildcard (git's ``simple_length``)."""
    return next((i for i, c in enumerate(pat) if c in _GLOB_SPECIAL), len(pat))


def translate(pat: bytes, *, pathname: bool = True, start: int = 0) -> bytes | None:
    """git's wildmatch (``WM_PATHNAME`` when ``pathname``) as an RE2 expression matching
    the whole text; None when the pattern can never match (git aborts on a trailing
    backslash, an unclosed class or an unknown ``[:class:]``).

    ``start``: where wildmatch's pattern begins. git compares a path pattern's literal
    prefix itself and hands only the rest to wildmatch, for which a ``**`` at that point
    follows the pattern's start, as if after a slash (so ``.**/x`` matches ``.x`` and
    ``.a/b/x``, and ``a**/b`` matches ``ab/c/b``)."""
    out: list[bytes] = []
    i, n = 0, len(pat)
    while i < n:
        ch = pat[i]
        if ch == ord("\\"):
            if i + 1 >= n:
                return None
            out.append(_lit(pat[i + 1]))
            i += 2
        elif ch == ord("?"):
            out.append(b"[^/]")
            i += 1
        elif ch == ord("*"):
            j = i
            while j < n and pat[j] == ord("*"):
                j += 1
            whole = (
                pathname
                and j - i >= 2
                and (i in (0, start) or pat[i - 1] == _SLASH)
                and (j == n or pat[j] == _SLASH or pat[j : j + 2] == b"\\/")
            )
            if not whole:
                out.append(b"[^/]*")
            elif j == n:
                out.append(b".*")
            elif pat[j] == _SLASH:
                out.append(b"(?:.*/)?")  # "**/": zero or more directories
                j += 1
            else:
                out.append(b".*")  # "**\/": no zero-directory shortcut in wildmatch
            i = j
        elif ch == ord("["):
            cls, j = _bracket(pat, i)
            if j < 0 or cls is None:
                return None
            out.append(cls)
            i = j
        else:
            out.append(_lit(ch))
            i += 1
    return b"".join(out)


def _trim_trailing_spaces(line: bytes) -> bytes:
    """git's trim_trailing_spaces: unescaped trailing spaces go."""
    last_space = -1
    i, n = 0, len(line)
    while i < n:
        ch = line[i]
        if ch == ord(" "):
            if last_space < 0:
                last_space = i
        elif ch == ord("\\"):
            i += 1
            if i >= n:
                return line
            last_space = -1
        else:
            last_space = -1
        i += 1
    return line[:last_space] if last_space >= 0 else line


@dataclass(frozen=True, slots=True)
class Pattern:
    """One line of a pattern file, ready to match a path relative to the repository root."""

    line: bytes
    negative: bool
    dir_only: bool
    source: bytes
    """RE2 source matching the whole repository-relative path."""


@dataclass(eq=False, slots=True)
class PatternList:
    """The patterns of one file (or of the defaults); ``base`` is its directory relative to
    the repository root, with a trailing slash ("" for the root)."""

    patterns: list[Pattern]
    base: bytes = b""
    name: str = ""
    _singles: list[_Compiled | None] = field(default_factory=list)


def parse(data: bytes, base: bytes = b"", name: str = "") -> PatternList:
    """Parse a ``.gitignore``-style file the way git's add_patterns_from_buffer does."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    prefix = b"".join(_lit(c) for c in base)
    out: list[Pattern] = []
    for raw in data.split(b"\n"):
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if not line or line.startswith(b"#"):
            continue
        line = _trim_trailing_spaces(line)
        text = line
        negative = text.startswith(b"!")
        if negative:
            text = text[1:]
        dir_only = text.endswith(b"/")
        if dir_only:
            text = text[:-1]
        if not text:
            continue  # "a blank line matches no files"
        if b"/" not in text:
            body = translate(text, pathname=False)
            source = None if body is None else prefix + b"(?:.*/)?" + body
        else:
            text = text[1:] if text.startswith(b"/") else text
            body = translate(text, start=literal_prefix(text))
            source = None if body is None else prefix + body
        if source is not None:
            out.append(Pattern(line, negative, dir_only, source))
    return PatternList(out, base, name)


class _StackMatcher:
    """The patterns in force for one directory, lowest precedence first: one combined
    expression answers "does any pattern match" (most paths: no); only a match walks the
    patterns from the highest precedence down to find whether the winner negates."""

    def __init__(self, lists: Sequence[PatternList]) -> None:
        self.ordered: list[tuple[Pattern, PatternList, int]] = [
            (p, pl, k) for pl in reversed(lists) for k, p in reversed(list(enumerate(pl.patterns)))
        ]
        self.has_negative = any(p.negative for p, _, _ in self.ordered)
        self.any_dir = self._any(p for p, _, _ in self.ordered)
        self.any_file = self._any(p for p, _, _ in self.ordered if not p.dir_only)

    @staticmethod
    def _any(patterns: Any) -> _Compiled | bool | None:
        sources = [p.source for p in patterns if not p.negative]
        if not sources:
            return False
        return _compile(b"(?:" + b"|".join(sources) + b")") or None

    def matches(self, text: bytes, is_dir: bool) -> bool:
        anyre = self.any_dir if is_dir else self.any_file
        if anyre is False:
            return False
        if anyre is not None and not _fullmatch(cast(_Compiled, anyre), text):
            return False
        if not self.has_negative and anyre is not None:
            return True
        for pattern, plist, k in self.ordered:
            if pattern.dir_only and not is_dir:
                continue
            if _fullmatch(_single(plist, k), text):
                return not pattern.negative
        return False


def _single(plist: PatternList, k: int) -> _Compiled:
    if not plist._singles:
        plist._singles.extend([None] * len(plist.patterns))
    rx = plist._singles[k]
    if rx is None:
        rx = _compile(plist.patterns[k].source)
        if rx is None:  # pragma: no cover - one translated pattern is always small
            rx = cast(_Compiled, _compile(b"[^\\x00-\\xff]"))
        plist._singles[k] = rx
    return rx


class Matcher:
    """Decides ignored paths of one tree. ``fixed`` are the lists in force everywhere
    (defaults, info/exclude, ``.gitignore`` files above the tree), lowest first; ``load``
    returns the ``.gitignore`` of a directory of the tree ("" is its root) as the tree holds
    it, or None; ``prefix`` is the tree's path in the repository (with a trailing slash)."""

    def __init__(
        self,
        fixed: Sequence[PatternList],
        load: Callable[[str], bytes | None],
        prefix: bytes = b"",
    ) -> None:
        self._fixed = tuple(fixed)
        self._load = load
        self._prefix = prefix
        self._dirs: dict[str, tuple[bool, tuple[PatternList, ...], _StackMatcher | None]] = {}
        self._stacks: dict[tuple[int, ...], _StackMatcher] = {}

    def _stack(self, lists: tuple[PatternList, ...]) -> _StackMatcher:
        key = tuple(id(pl) for pl in lists)
        found = self._stacks.get(key)
        if found is None:
            found = self._stacks[key] = _StackMatcher(lists)
        return found

    def _dir(self, rel: str) -> tuple[bool, tuple[PatternList, ...], _StackMatcher | None]:
        """(excluded, lists in force for its children, their matcher) of directory ``rel``."""
        known = self._dirs.get(rel)
        if known is not None:
            return known
        if rel:
            parent, _, _ = rel.rpartition("/")
            excluded, lists, matcher = self._dir(parent)
            if not excluded:
                assert matcher is not None
                excluded = matcher.matches(self._prefix + os.fsencode(rel), True)
        else:
            excluded, lists = False, self._fixed
        if not excluded:
            data = self._load(rel)
            if data is not None:
                base = self._prefix + (os.fsencode(rel) + b"/" if rel else b"")
                lists = (*lists, parse(data, base, rel + "/.gitignore"))
        state = (excluded, lists, None if excluded else self._stack(lists))
        self._dirs[rel] = state
        return state

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative to the tree, "/"-separated) is ignored.

        A directory is asked the way ``git check-ignore dir/`` asks: excluded itself, or
        its path with the trailing slash matched by the rules in force inside it (so
        ``tail/**`` ignores the directory ``tail`` along with everything in it)."""
        if is_dir:
            _, _, matcher = self._dir(path)
            if matcher is None:
                return True
            return matcher.matches(self._prefix + os.fsencode(path) + b"/", True)
        _, _, matcher = self._dir(path.rpartition("/")[0])
        if matcher is None:
            return True
        return matcher.matches(self._prefix + os.fsencode(path), False)
