"""diff: the patch ``git apply --check`` then ``git apply`` accept in a copy of the lower,
giving the merged view (what git can carry of it), and ``git apply -R`` taking it back."""

from __future__ import annotations

import hashlib
import shutil
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.state.workspace import Manifest, apply, diff, list_changes
from supervisor.state.workspace.patch import MAX_DIFF_BYTES, quote
from tests.conftest import examples
from tests.unit.workspace_tools import (
    File,
    Link,
    build,
    git_apply,
    git_view,
    needs_root,
    opaque,
    whiteout,
)

pytestmark = [needs_root, pytest.mark.skipif(shutil.which("git") is None, reason="needs git")]


def merged_view(lower: Path, upper: Path, work: Path) -> dict[str, tuple[object, ...]]:
    """Apply to a copy and look at it: the merged view as apply writes it."""
    copy = work / f"merged-{time.monotonic_ns()}"
    shutil.copytree(lower, copy, symlinks=True)
    changes = list_changes(copy, upper, Manifest.take(copy))
    apply(
        copy,
        upper,
        changes,
        work / f"backup-{time.monotonic_ns()}",
        owner=(0, 0),
        include_ignored=True,
    )
    view = git_view(copy)
    shutil.rmtree(copy)
    return view


def round_trip(tmp_path: Path, lower: Path, upper: Path) -> str:
    changes = list_changes(lower, upper, Manifest.take(lower))
    patch = diff(lower, upper, changes, include_ignored=True, full=True)
    if not patch:  # nothing git can carry changed (git apply refuses an empty patch)
        assert git_view(lower) == merged_view(lower, upper, tmp_path)
        return patch
    copy = tmp_path / "copy"
    shutil.copytree(lower, copy, symlinks=True)
    git_apply(patch, copy)
    assert git_view(copy) == merged_view(lower, upper, tmp_path)
    git_apply(patch, copy, "-R")
    assert git_view(copy) == git_view(lower)
    shutil.rmtree(copy)
    return patch


def test_every_kind_of_change(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    build(
        lower,
        {
            "edit.txt": "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n",
            "noeol.txt": "no newline",
            "crlf.txt": "one\r\ntwo\r\n",
            "mode.sh": File(b"echo\n", 0o644),
            "gone.txt": "bye\n",
            "gone.bin": b"\0\1\2",
            "gonedir/a": "a",
            "gonedir/b/c": "c",
            "gonedir/ln": Link("a"),
            "bin.dat": b"\0" * 100 + b"old",
            "link": Link("edit.txt"),
            "f2l": "file",
            "l2f": Link("x"),
            "d2f/x": "x",
            "f2d": "file",
            "opq/old": "old",
            "empty": "",
            "latin.txt": "text",
        },
    )
    build(
        upper,
        {
            "edit.txt": "a\nb\nc\nD\ne\nf\ng\nh\ni\nj\nk\n",
            "noeol.txt": "no newline, still",
            "crlf.txt": "one\r\ntwo\r\nthree\r\n",
            "mode.sh": File(b"echo\n", 0o755),
            "bin.dat": b"\0" * 100 + b"new!",
            "link": Link("noeol.txt"),
            "f2l": Link("edit.txt"),
            "l2f": "now a file",
            "d2f": "now a file",
            "f2d/inner": "inside",
            "opq/new": "new",
            "new.txt": "hello\n",
            "new.bin": bytes(range(256)),
            "newempty": "",
            "empty": "not any more\n",
            "latin.txt": b"caf\xe9\n",
            "sub/dir/deep.txt": "deep\n",
            "sp ace.txt": "x\n",
            "tab\tname": "x\n",
            'quo"te': "x\n",
            "back\\slash": "x\n",
            "new\nline": "x\n",
            "caf\udce9": "x\n",
            "ünïcode.txt": "x\n",
            "-rf": "x\n",
            "--force": "x\n",
            "a b/c d": "x\n",
            "x b/y": "x\n",
            "ln-bad": Link("caf\udcff"),
        },
    )
    for rel in ("gone.txt", "gone.bin", "gonedir"):
        whiteout(upper, rel)
    opaque(upper, "opq")
    patch = round_trip(tmp_path, lower, upper)
    assert "GIT binary patch" in patch and "old mode 100644\nnew mode 100755" in patch
    assert '"b/caf\\351"' in patch and '"b/new\\nline"' in patch
    assert "--- a/sp ace.txt\t" in patch or "+++ b/sp ace.txt\t" in patch
    patch.encode("utf-8")  # always valid text


def test_big_text_file_whole_replacement(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    lines = [f"line {i}\n" for i in range(MAX_DIFF_BYTES // 8)]
    build(lower, {"big.txt": "".join(lines)})
    lines[1000] = "changed\n"
    build(upper, {"big.txt": "".join(lines)})
    patch = round_trip(tmp_path, lower, upper)
    assert patch.count("\n-line ") > 1000  # one hunk replacing everything


def test_large_files_are_sizes_and_hashes_unless_full(tmp_path: Path) -> None:
    """Item 8 of the workspace review: an 8 MiB file of newlines took 747 MB to diff. Over
    LARGE_BYTES a file is its sizes and hashes; the full diff streams lines one by one."""
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    build(lower, {"big.txt": b"\n" * (8 << 20), "small.txt": "a\n"})
    build(upper, {"big.txt": b"\n" * ((8 << 20) + 1), "small.txt": "b\n"})
    changes = list_changes(lower, upper, Manifest.take(lower))
    tracemalloc.start()
    try:
        short = diff(lower, upper, changes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # bounded: nothing of the 8 MiB is kept
    big = hashlib.sha256(b"\n" * ((8 << 20) + 1)).hexdigest()
    assert f"new {(8 << 20) + 1} bytes, sha256 {big}" in short and "-a\n+b\n" in short
    # The full diff (asked for explicitly) of a file of newlines over the line limit: one
    # hunk, lines streamed one at a time rather than held as a list.
    n = (3 << 20) // 2
    build(upper, {"big.txt": b"\n" * n})
    full = diff(lower, upper, list_changes(lower, upper, Manifest.take(lower)), full=True)
    assert full.count("-\n") == 8 << 20 and full.count("+\n") == n


def test_quote_like_git() -> None:
    assert quote(b"a/plain name") == "a/plain name"
    assert quote(b'a/"q"\\\t\n\x7f\xc3\xa9') == '"a/\\"q\\"\\\\\\t\\n\\177\\303\\251"'


_TEXT = st.lists(
    st.sampled_from(["a\n", "b\n", "c\n", "\n", "x", "é\n", "tab\there\n", "cr\r\n", "\r"]),
    max_size=30,
).map("".join)
_DATA = st.one_of(_TEXT.map(str.encode), st.binary(max_size=300))


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    pairs=st.lists(st.tuples(_DATA, _DATA, st.booleans(), st.booleans()), min_size=1, max_size=6)
)
def test_hypothesis_file_pairs(
    tmp_path: Path, pairs: list[tuple[bytes, bytes, bool, bool]]
) -> None:
    base = tmp_path / f"case-{time.monotonic_ns()}"
    lower, upper = base / "lower", base / "upper"
    lower.mkdir(parents=True)
    upper.mkdir()
    for i, (old, new, old_x, new_x) in enumerate(pairs):
        (lower / f"f{i}").write_bytes(old)
        (lower / f"f{i}").chmod(0o755 if old_x else 0o644)
        (upper / f"f{i}").write_bytes(new)
        (upper / f"f{i}").chmod(0o755 if new_x else 0o644)
    round_trip(base, lower, upper)
    shutil.rmtree(base)
