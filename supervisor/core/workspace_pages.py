"""Pages of a workspace's change listing: the page size's range, the cursor's text form, and
one page cut from the listing (sorted by path).

A cursor is a path: a page holds the entries strictly after it in the listing's order
(Python's ``str`` order of the paths, names that are not UTF-8 as surrogate escapes: the
order the listing is sorted in). As text it is the path itself, or ``b64:`` and the base64
of the name's bytes for a name that is not UTF-8 or that itself begins with ``b64:``: every
cursor a page hands out reads back as exactly its path. No pydantic import: the CLI and the
client load this.
"""

from __future__ import annotations

import base64
import binascii
import os
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from supervisor.core.problems import InvalidRequest

#: Entries in a page when the caller names no ``limit``.
PAGE_DEFAULT: Final = 1000
#: The largest ``limit`` a page takes.
PAGE_MAX: Final = 10_000
#: Marks a cursor given as the base64 of the name's bytes.
B64: Final = "b64:"
#: The longest cursor taken as text: a 4096-byte name in base64, with room.
CURSOR_MAX: Final = 8192

T = TypeVar("T")


def _bad(field: str, problem: str) -> InvalidRequest:
    """The 422 the daemon's own validation gives: the message and ``fields`` name it."""
    return InvalidRequest(problem, field=field, fields=[{"field": field, "message": problem}])


def check_limit(limit: object, field: str = "limit") -> int:
    """``limit`` as a page size, or InvalidRequest naming ``field`` and the range."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= PAGE_MAX:
        raise _bad(field, f"must be an integer from 1 to {PAGE_MAX} (got {limit!r})")
    return limit


def cursor(path: str) -> str:
    """The text form of ``path`` as a cursor (see the module's docstring)."""
    raw = os.fsencode(path)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return B64 + base64.b64encode(raw).decode()
    return B64 + base64.b64encode(raw).decode() if path.startswith(B64) else path


def cursor_path(text: str, field: str = "after") -> str:
    """The path a cursor's text names; InvalidRequest naming ``field`` when it is too long, or
    begins with ``b64:`` without valid base64 after it."""
    if len(text) > CURSOR_MAX:
        raise _bad(field, f"at most {CURSOR_MAX} characters (got {len(text)}): a path")
    if not text.startswith(B64):
        return text
    try:
        raw = base64.b64decode(text[len(B64) :], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _bad(
            field,
            "begins with 'b64:' but the rest is not base64; a path that begins with 'b64:' "
            "(or is not UTF-8) is given as 'b64:' and the base64 of its bytes, as a page's "
            "'next' gives it",
        ) from exc
    return os.fsdecode(raw)


def cut(
    listing: Sequence[T], key: Callable[[T], str], after: str | None, limit: int
) -> tuple[list[T], str | None]:
    """The page of ``listing`` (sorted by ``key``) after the path ``after`` (from the start
    when None): at most ``limit`` entries, and the cursor of the next page (None when this
    one reaches the end)."""
    start = 0 if after is None else bisect_right(listing, after, key=key)
    page = list(listing[start : start + check_limit(limit)])
    more = start + len(page) < len(listing)
    return page, cursor(key(page[-1])) if more and page else None
