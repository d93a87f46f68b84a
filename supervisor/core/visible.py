"""Characters that could drive a terminal, or hide or reorder text, shown as visible escapes.

One rule for every place that shows text a task chose (its output, command, description,
file names) to a person or a model: the agent's notifications (``render.xml_text``), the
dashboard (``ui/ansi.js`` applies the same set), and the CLI on a terminal. What counts:

- C0 controls, DEL and C1 controls (ESC starts terminal sequences; U+009B is an 8-bit CSI);
- bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069, the marks
  U+200E, U+200F, U+061C): they reorder what a reader sees ("Trojan Source");
- every other invisible format character (Unicode category Cf: zero-width space U+200B,
  word joiner, invisible operators, BOM U+FEFF, interlinear annotation, tags U+E00xx, ...)
  except the zero-width joiner and non-joiner (U+200C, U+200D), which emoji and several
  scripts need and which neither reorder nor erase text;
- the line and paragraph separators U+2028, U+2029, lone surrogates, and the
  non-characters U+FFFE, U+FFFF (not valid in XML).

Each becomes ``\\xNN`` (below U+0100), ``\\uNNNN`` or ``\\UNNNNNNNN``: the same spelling
as a Python or JavaScript string literal, so a reader can tell exactly what was there.
"""

from __future__ import annotations

import re

#: The characters ``visible`` escapes (a regex character class body). Category Cf is
#: listed by range, as of Unicode 15 (the unit tests check it against ``unicodedata``).
UNSAFE_CLASS = (
    "\x00-\x1f\x7f-\x9f"
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e"
    "\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
    "\ud800-\udfff\ufeff\ufff9-\ufffb\ufffe\uffff"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
_UNSAFE = re.compile(f"[{UNSAFE_CLASS}]")
_CACHE: dict[str, re.Pattern[str]] = {"": _UNSAFE}


def escape_char(ch: str) -> str:
    """``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN`` for one character. A lone surrogate
    U+DC80-U+DCFF (how Python's ``surrogateescape`` carries an undecodable byte) shows as
    that byte, ``\\xNN``."""
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:
        code -= 0xDC00
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escape(match: re.Match[str]) -> str:
    return escape_char(match.group())


def _pattern(keep: str) -> re.Pattern[str]:
    found = _CACHE.get(keep)
    if found is None:
        kept = "".join(f"\\x{ord(c):02x}" for c in keep if ord(c) < 0x20)
        if len(kept) != 4 * len(keep):
            raise ValueError("keep takes C0 control characters only (e.g. tab, newline)")
        found = _CACHE[keep] = re.compile(f"(?![{kept}])[{UNSAFE_CLASS}]")
    return found


def visible(text: str, keep: str = "") -> str:
    """``text`` with every unsafe character (see the module) escaped, except those in
    ``keep`` (C0 controls only, e.g. ``"\\t\\n"``)."""
    return _pattern(keep).sub(_escape, text)


def has_unsafe(text: str, keep: str = "") -> bool:
    """Whether ``visible(text, keep)`` would change anything."""
    return _pattern(keep).search(text) is not None


def quote_name(name: str) -> str:
    """A file name for a terminal, the way ``git`` shows one (``core.quotePath``): as it is
    when plain, else in double quotes with ``\\`` and ``"`` escaped and every unsafe
    character visible (a name can no longer erase a line, set the clipboard through OSC 52
    or reorder what is shown)."""
    if not has_unsafe(name) and '"' not in name and "\\" not in name:
        return name
    return '"' + visible(name.replace("\\", "\\\\").replace('"', '\\"')) + '"'
