"""Pages of a workspace listing: the page size's range, cursors that read back as exactly their
path (names with newlines, quotes, bidi overrides, bytes that are not UTF-8, names that
begin with ``b64:``), pages that together are the listing, in its order; and ``page_of`` on
synthetic uppers, hashing only the page."""

from __future__ import annotations

import os
from operator import attrgetter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.core.problems import InvalidRequest
from supervisor.core.workspace_pages import (
    PAGE_MAX,
    check_limit,
    cursor,
    cursor_path,
    cut,
)
from supervisor.state.workspace import (
    Change,
    IgnoreRules,
    Manifest,
    classify,
    list_changes,
    page_of,
)
from tests.unit.workspace_tools import build, needs_root, whiteout

#: Names that sort around "/" (0x2f): "-" and "." below it, "0" and ":" above it, and a
#: directory "a" whose children ("a/…") sort after "a-b" and "a.b" but before "a0".
AROUND_SLASH = ["a", "a-b", "a.b", "a/b", "a/b/c", "a0", "a:b", "a b"]
#: Names a cursor has to carry exactly.
HOSTILE = [
    "line\nbreak",
    "tab\there",
    'quote"d',
    "back\\slash",
    "bidi\u202etxt.exe",
    "zero\u200bwidth",
    "caf\u00e9",
    "cafe\u0301",  # the same text, decomposed: a different name
    "emoji\U0001f600",
    "esc\x1b[2J",
    os.fsdecode(b"latin1-\xe9"),  # not UTF-8: a surrogate escape
    "b64:aGk=",  # a UTF-8 name that looks like a cursor in base64
    "b64:",
    "-dash",
    " space",
]

paths = st.text(
    st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1
) | st.binary(min_size=1).filter(lambda b: b"\x00" not in b).map(os.fsdecode)


@pytest.mark.parametrize("bad", [0, -1, PAGE_MAX + 1, True, "10", 1.5, None])
def test_a_limit_outside_the_range_names_the_field_and_the_range(bad: object) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_limit(bad)
    assert str(caught.value).startswith("limit: must be an integer from 1 to 10000")
    assert caught.value.field == "limit"


def test_the_limits_edges_are_taken() -> None:
    assert check_limit(1) == 1 and check_limit(PAGE_MAX) == PAGE_MAX


@pytest.mark.parametrize("name", HOSTILE + AROUND_SLASH)
def test_a_cursor_reads_back_as_exactly_its_path(name: str) -> None:
    text = cursor(name)
    assert cursor_path(text) == name
    text.encode("utf-8")  # always valid text (a JSON string, a query parameter)


@given(paths)
def test_every_cursor_reads_back_as_exactly_its_path(name: str) -> None:
    assert cursor_path(cursor(name)) == name


def test_a_cursor_is_the_path_itself_when_it_can_be() -> None:
    assert cursor("src/app.py") == "src/app.py"
    assert cursor("line\nbreak") == "line\nbreak"
    assert cursor(os.fsdecode(b"\xff")) == "b64:/w=="
    assert cursor("b64:aGk=") == "b64:YjY0OmFHaz0="


@pytest.mark.parametrize("text", ["b64:not base64!", "b64:a", "x" * 8193])
def test_a_bad_cursor_names_the_field(text: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        cursor_path(text)
    assert caught.value.field == "after"


@given(st.lists(paths, unique=True, max_size=60), st.integers(1, 7))
def test_pages_read_in_turn_are_the_listing_in_its_order(names: list[str], limit: int) -> None:
    listing = sorted(names)
    seen: list[str] = []
    after: str | None = None
    while True:
        page, following = cut(listing, str, after, limit)
        assert len(page) <= limit
        seen += page
        if following is None:
            break
        assert page, "a page before the last is never empty"
        after = cursor_path(following)
    assert seen == listing


@given(st.lists(paths, unique=True, max_size=40), paths, st.integers(1, 50))
def test_a_page_starts_strictly_after_any_path(names: list[str], after: str, limit: int) -> None:
    """Also a path no longer in the listing (its file was applied or removed meanwhile)."""
    listing = sorted(names)
    page, _ = cut(listing, str, cursor_path(cursor(after)), limit)
    assert page == [p for p in listing if p > after][:limit]


def test_the_order_around_slash_is_the_listings() -> None:
    listing = sorted(AROUND_SLASH)
    assert listing == ["a", "a b", "a-b", "a.b", "a/b", "a/b/c", "a0", "a:b"]
    page, following = cut(listing, str, "a-b", 3)
    assert page == ["a.b", "a/b", "a/b/c"] and following == "a/b/c"
    assert cut(listing, str, "a/b/c", 3) == (["a0", "a:b"], None)
    assert cut(listing, str, "a:b", 3) == ([], None)


# -- page_of on synthetic uppers ------------------------------------------------------------


def _page_through(upper: Path, listing: list[Change], limit: int, ignored: bool) -> list[Change]:
    seen: list[Change] = []
    after: str | None = None
    while True:
        page = page_of(upper, listing, limit=limit, after=after, ignored=ignored)
        seen += page.changes
        if page.next is None:
            return seen
        after = cursor_path(page.next)


@needs_root
@pytest.mark.parametrize("limit", [1, 2, 5, PAGE_MAX])
def test_paging_an_upper_gives_every_change_once_with_its_digest(
    tmp_path: Path, limit: int
) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    build(lower, {"gone/a.txt": "a\n", "gone/sub/b.txt": "b\n", "keep.txt": "k\n"})
    files: dict[str, str | bytes] = {n: os.fsencode(n) + b"\n" for n in HOSTILE}
    files.update({"a": "file a\n", "a-b": "x\n", "a.b": "y\n", "a0": "z\n", "a:b": "w\n"})
    files.update({"dir/x": "1\n", "dir-y": "2\n", "dir/sub/z": "3\n", "mod.pyc": "pyc\n"})
    build(upper, files)
    whiteout(upper, "gone")  # a deleted directory: one change
    manifest = Manifest.take(lower)
    everything = list_changes(lower, upper, manifest)
    listing = classify(lower, upper, manifest)
    assert [c.path for c in listing] == [c.path for c in everything]
    assert all(c.digest is None for c in listing), "the walk hashes nothing"
    assert [c.path for c in listing] == sorted(c.path for c in listing)
    gone = [c for c in listing if c.path.startswith("gone")]
    assert [(c.path, c.kind, c.file_type) for c in gone] == [("gone", "deleted", "dir")]

    seen = _page_through(upper, listing, limit, ignored=True)
    assert [(c.path, c.digest) for c in seen] == [(c.path, c.digest) for c in everything]
    assert all(c.digest is None for c in listing), "a page hashes copies, not the walk"

    visible = _page_through(upper, listing, limit, ignored=False)
    assert [c.path for c in visible] == [c.path for c in everything if not c.ignored]
    assert "mod.pyc" not in {c.path for c in visible}


@needs_root
def test_a_page_counts_the_listing_and_hashes_only_its_own_entries(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    build(lower, {"README": "r\n"})
    build(upper, {f"f{i:03}": f"{i}\n" for i in range(30)})
    (upper / "f029").chmod(0)  # root reads it anyway; what matters is the count of reads
    listing = classify(lower, upper, Manifest.take(lower), IgnoreRules())
    page = page_of(upper, listing, limit=10, after="f004")
    assert [c.path for c in page.changes] == [f"f{i:03}" for i in range(5, 15)]
    assert page.total == 30 and page.next == "f014"
    assert all(c.digest for c in page.changes)
    assert sum(1 for c in listing if c.digest) == 0
    last = page_of(upper, listing, limit=10, after="f019")
    assert last.next is None and [c.path for c in last.changes][-1] == "f029"
    assert page_of(upper, listing, limit=10, after="g").changes == []
    assert page.to_dict()["next"] == "f014" and len(page.to_dict()["changes"]) == 10


def test_the_cut_takes_the_listings_key() -> None:
    listing = [Change(p, "added", "file") for p in sorted(AROUND_SLASH)]
    page, following = cut(listing, attrgetter("path"), "a", 2)
    assert [c.path for c in page] == ["a b", "a-b"] and following == "a-b"
