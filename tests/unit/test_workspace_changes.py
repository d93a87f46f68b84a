"""list_changes and Manifest on synthetic overlay uppers (whiteouts made with mknod, opaque
directories with setxattr), conflicts against the manifest, and what is left out."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from supervisor.state.workspace import (
    IgnoreRules,
    Manifest,
    WorkspaceError,
    list_changes,
)
from supervisor.state.workspace.fsutil import MAX_DEPTH
from supervisor.state.workspace.manifest import CLOCK_SLACK_NS
from tests.unit.workspace_tools import (
    Dir,
    Fifo,
    File,
    Link,
    build,
    by_path,
    kinds,
    needs_root,
    opaque,
    whiteout,
)

pytestmark = needs_root


@pytest.fixture
def lu(tmp_path: Path) -> tuple[Path, Path]:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    lower.mkdir()
    upper.mkdir()
    return lower, upper


def listing(lower: Path, upper: Path, manifest: Manifest | None = None, **rules: object):
    manifest = manifest or Manifest.take(lower)
    return list_changes(lower, upper, manifest, IgnoreRules(**rules))  # type: ignore[arg-type]


def test_each_kind(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(
        lower,
        {
            "same.txt": "same\n",
            "touched.txt": "touched\n",
            "edit.txt": "old\n",
            "chmod.sh": File(b"#!/bin/sh\n", 0o644),
            "gone.txt": "bye\n",
            "gonedir/a": "a",
            "gonedir/sub/b": "b",
            "link": Link("same.txt"),
            "f2d": "was a file",
            "d2f/x": "x",
            "f2l": "file",
        },
    )
    manifest = Manifest.take(lower)
    build(
        upper,
        {
            "touched.txt": "touched\n",  # copied up by touch: same bytes, other mtime
            "edit.txt": "new\n",
            "chmod.sh": File(b"#!/bin/sh\n", 0o755),
            "new.txt": "hello\n",
            "newdir/inner/deep.txt": "deep",
            "link": Link("edit.txt"),
            "f2d/child": "c",
            "d2f": "now a file",
            "f2l": Link("same.txt"),
        },
    )
    os.utime(upper / "touched.txt", ns=(1, 1))
    whiteout(upper, "gone.txt")
    whiteout(upper, "gonedir")
    got = list_changes(lower, upper, manifest)
    assert kinds(got) == {
        "chmod.sh": "mode",
        "d2f": "replaced",
        "edit.txt": "modified",
        "f2d": "replaced",
        "f2d/child": "added",
        "f2l": "replaced",
        "gone.txt": "deleted",
        "gonedir": "deleted",
        "link": "modified",
        "new.txt": "added",
        "newdir": "added",
        "newdir/inner": "added",
        "newdir/inner/deep.txt": "added",
    }
    c = by_path(got)
    assert (c["chmod.sh"].old_mode, c["chmod.sh"].new_mode) == (0o644, 0o755)
    assert (c["d2f"].old_type, c["d2f"].file_type) == ("dir", "file")
    assert (c["f2d"].old_type, c["f2d"].file_type) == ("file", "dir")
    assert (c["f2l"].old_type, c["f2l"].file_type, c["f2l"].target) == (
        "file",
        "symlink",
        "same.txt",
    )
    assert (c["link"].old_target, c["link"].target) == ("same.txt", "edit.txt")
    assert (c["edit.txt"].size, c["edit.txt"].old_size) == (4, 4)
    assert c["gone.txt"].size == 4 and c["gone.txt"].new_mode is None
    assert c["gonedir"].file_type == "dir"
    assert not any(ch.conflict or ch.ignored or ch.binary for ch in got)
    assert [ch.path for ch in got] == sorted(ch.path for ch in got)


def test_opaque_dir_lists_dir_children_and_lower_leftovers(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"d/keep.txt": "same", "d/old.txt": "old", "d/sub/x": "x", "d/edit": "1"})
    manifest = Manifest.take(lower)
    opaque(upper, "d")
    build(upper, {"d/keep.txt": "same", "d/new.txt": "new", "d/edit": "2"})
    got = list_changes(lower, upper, manifest)
    assert kinds(got) == {
        "d": "replaced",
        "d/edit": "modified",
        "d/new.txt": "added",
        "d/old.txt": "deleted",
        "d/sub": "deleted",
    }


def test_opaque_dir_equal_to_lower_is_no_change(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"d/a": "a"})
    manifest = Manifest.take(lower)
    opaque(upper, "d", attr="trusted.overlay.opaque")  # the default overlay xattr works too
    build(upper, {"d/a": "a"})
    assert list_changes(lower, upper, manifest) == []


def test_opaque_inside_opaque_and_subdirs_are_complete(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"d/s/a": "a", "d/s/b": "b"})
    manifest = Manifest.take(lower)
    opaque(upper, "d")
    build(upper, {"d/s/a": "a"})  # d/s is not marked itself: inside an opaque dir it is whole
    assert kinds(list_changes(lower, upper, manifest)) == {"d": "replaced", "d/s/b": "deleted"}


def test_whiteout_over_nothing_and_identical_entries_are_dropped(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"a": "a", "dir/b": "b", "ln": Link("a")})
    manifest = Manifest.take(lower)
    whiteout(upper, "never-existed")
    build(upper, {"a": "a", "dir/b": "b", "ln": Link("a")})
    (upper / "dir").chmod(0o755)
    assert list_changes(lower, upper, manifest) == []


def test_dir_mode_change(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"d": Dir(0o755), "d/f": "x"})
    manifest = Manifest.take(lower)
    build(upper, {"d": Dir(0o700)})
    got = list_changes(lower, upper, manifest)
    assert kinds(got) == {"d": "mode"}
    assert (got[0].old_mode, got[0].new_mode) == (0o755, 0o700)


def test_special_files_are_listed_with_a_note(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    manifest = Manifest.take(lower)
    build(upper, {"fifo": Fifo()})
    os.mknod(upper / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    got = by_path(list_changes(lower, upper, manifest))
    assert got["fifo"].file_type == "fifo" and not got["fifo"].applicable
    assert got["null"].file_type == "char_device" and "skips" in (got["null"].note or "")


def test_hard_links_and_outward_symlinks_get_notes(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    manifest = Manifest.take(lower)
    build(upper, {"a": "data", "abs": Link("/etc/passwd"), "up": Link("../../x"), "in": Link("a")})
    os.link(upper / "a", upper / "b")
    got = by_path(list_changes(lower, upper, manifest))
    assert "hard-linked" in (got["b"].note or "")
    assert "absolute" in (got["abs"].note or "")
    assert "out of the workspace" in (got["up"].note or "")
    assert got["in"].note is None


def test_binary_detection(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    manifest = Manifest.take(lower)
    cut = "é".encode() * 4096  # 8192 bytes: the 8 KiB window ends between characters
    build(
        upper,
        {
            "nul": b"abc\0def",
            "latin1": b"caf\xe9\n",
            "utf8": "naïve ✓\n".encode(),
            "cut_at_8k": b"x" + cut,
            "bad_late": b"a" * 9000 + b"\xff",
        },
    )
    got = {c.path: c.binary for c in list_changes(lower, upper, manifest)}
    # Bytes past the first 8 KiB are not looked at (the diff decides on the whole file).
    assert got == {
        "nul": True,
        "latin1": True,
        "utf8": False,
        "cut_at_8k": False,
        "bad_late": False,
    }


def test_odd_names(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    manifest = Manifest.take(lower)
    names = [b"-rf", b"--force", b"new\nline", b"caf\xe9", b"sp ace", b'quo"te', b"back\\slash"]
    for name in names:
        (upper / os.fsdecode(name)).write_bytes(b"x")
    got = list_changes(lower, upper, manifest)
    assert sorted(c.path_bytes for c in got) == sorted(names)
    odd = next(c for c in got if c.path_bytes == b"caf\xe9")
    assert odd.to_dict()["path"] == "caf\\xe9" and odd.to_dict()["path_b64"] == "Y2Fm6Q=="


def test_unsupported_overlay_features_are_refused(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(upper, {"moved/x": "x"})
    os.setxattr(upper / "moved", "user.overlay.redirect", b"/orig")
    with pytest.raises(WorkspaceError, match="redirect"):
        list_changes(lower, upper, Manifest.take(lower))


def test_too_deep_is_refused(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    fd = os.open(upper, os.O_RDONLY)
    for _ in range(MAX_DEPTH + 2):
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    with pytest.raises(WorkspaceError, match="deeper"):
        list_changes(lower, upper, Manifest.take(lower))


# -- conflicts ----------------------------------------------------------------------------


def test_conflicts_against_the_manifest(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(
        lower,
        {"edited": "1", "removed": "1", "calm": "1", "tree/a": "a", "tree/b": "b", "other": "1"},
    )
    manifest = Manifest.take(lower)
    # The host, meanwhile:
    (lower / "edited").write_text("host edit")
    (lower / "removed").unlink()
    (lower / "appeared").write_text("host new")
    (lower / "tree" / "b").write_text("host edit")
    (lower / "other").write_text("host edit, not touched by the agent")
    # The agent:
    build(upper, {"edited": "agent", "removed": "agent", "calm": "agent", "appeared": "agent"})
    whiteout(upper, "tree")
    got = by_path(list_changes(lower, upper, manifest))
    assert got["edited"].conflict and "changed" in (got["edited"].conflict_reason or "")
    assert got["removed"].conflict and "removed" in (got["removed"].conflict_reason or "")
    assert got["appeared"].conflict and "appeared" in (got["appeared"].conflict_reason or "")
    assert got["tree"].conflict and (got["tree"].conflict_reason or "").startswith("tree/b:")
    assert not got["calm"].conflict
    assert "other" not in got


def test_subtree_conflict_sees_removed_and_added_entries(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"t/a": "a", "t/s/b": "b"})
    manifest = Manifest.take(lower)
    (lower / "t" / "s" / "b").unlink()
    whiteout(upper, "t")
    got = by_path(list_changes(lower, upper, manifest))
    assert got["t"].conflict_reason == "t/s/b: removed on the host since the session started"
    (lower / "t" / "s" / "b").write_text("b again")  # a new inode: still a change
    got = by_path(list_changes(lower, upper, manifest))
    assert got["t"].conflict


def test_heavy_dirs_are_skipped_but_watched(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"node_modules/pkg/index.js": "1", "src/a.js": "1"})
    # Inside a skipped directory, "changed" means a ctime or mtime after the snapshot
    # started, less a slack for the coarse file clock: the files must be older than that.
    built = time.time_ns()
    while time.time_ns() < built + 2 * CLOCK_SLACK_NS:
        time.sleep(0.01)
    manifest = Manifest.take(lower)
    assert "node_modules/pkg/index.js" not in manifest.entries
    assert "node_modules" in manifest.skipped and "src/a.js" in manifest.entries
    build(upper, {"node_modules/pkg/index.js": "agent"})
    assert not list_changes(lower, upper, manifest)[0].conflict
    (lower / "node_modules" / "pkg" / "index.js").write_text("host")  # after the snapshot
    assert list_changes(lower, upper, manifest)[0].conflict


def test_tracked_files_keep_heavy_dirs_in_the_manifest(lu: tuple[Path, Path]) -> None:
    lower, _ = lu
    build(lower, {"target/keep.txt": "tracked", "target/junk.o": "x"})
    manifest = Manifest.take(lower, tracked=["target/keep.txt"])
    assert "target/keep.txt" in manifest.entries and "target" not in manifest.skipped


def test_manifest_round_trip_and_damage(tmp_path: Path) -> None:
    lower = tmp_path / "lower"
    build(
        lower,
        {
            "a": "1",
            "d/b": "2",
            b"caf\xe9".decode("utf-8", "surrogateescape"): "3",
            "node_modules/x": "y",
        },
    )
    manifest = Manifest.take(lower)
    manifest.save(tmp_path / "m")
    loaded = Manifest.load(tmp_path / "m")
    assert loaded.entries == manifest.entries
    assert loaded.skipped == manifest.skipped and loaded.since_ns == manifest.since_ns
    assert loaded.under("d") == ["d/b"]
    (tmp_path / "bad").write_bytes(b"SANDVISORMANIFEST 1\n{}\nnot zlib")
    with pytest.raises(WorkspaceError, match="damaged"):
        Manifest.load(tmp_path / "bad")


def test_manifest_does_not_follow_symlinks_out(tmp_path: Path) -> None:
    lower = tmp_path / "lower"
    build(lower, {"out": Link("/etc"), "in": "x"})
    manifest = Manifest.take(lower)
    assert set(manifest.entries) == {"out", "in"}
    assert stat.S_ISLNK(manifest.entries["out"][0])


def test_manifest_of_100k_entries_loads_fast(tmp_path: Path) -> None:
    entries = {f"d{i // 1000}/f{i}": (0o100644, i, i, i, i) for i in range(100_000)}
    Manifest(str(tmp_path), 0, entries).save(tmp_path / "m")
    t0 = time.perf_counter()
    loaded = Manifest.load(tmp_path / "m")
    assert time.perf_counter() - t0 < 1.0
    assert len(loaded) == 100_000 and loaded.get("d7/f7777") == (0o100644, 7777, 7777, 7777, 7777)


# -- ignored ------------------------------------------------------------------------------


def test_ignore_rules_in_the_merged_view(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {".gitignore": "*.log\n/top-only\n", "sub/.gitignore": "!keep.log\n"})
    manifest = Manifest.take(lower)
    build(
        upper,
        {
            "a.log": "x",
            "sub/keep.log": "x",
            "sub/top-only": "x",
            "top-only": "x",
            "node_modules/m/i.js": "x",
            "src/__pycache__/m.pyc": "x",
            "src/m.py": "x",
        },
    )
    for use_git in (True, False):
        got = {c.path: c.ignored for c in listing(lower, upper, manifest, use_git=use_git)}
        assert got == {
            "a.log": True,
            "node_modules": True,
            "node_modules/m": True,
            "node_modules/m/i.js": True,
            "src": False,
            "src/__pycache__": True,
            "src/__pycache__/m.pyc": True,
            "src/m.py": False,
            "sub/keep.log": False,
            "sub/top-only": False,
            "top-only": True,
        }, use_git


def test_an_upper_gitignore_counts(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {".gitignore": "*.log\n"})
    manifest = Manifest.take(lower)
    build(upper, {".gitignore": "*.tmp\n", "a.log": "x", "b.tmp": "x"})
    got = {c.path: c.ignored for c in list_changes(lower, upper, manifest)}
    assert got == {".gitignore": False, "a.log": False, "b.tmp": True}
    (upper / ".gitignore").unlink()
    whiteout(upper, ".gitignore")  # the agent deleted the project's .gitignore
    got = {c.path: c.ignored for c in list_changes(lower, upper, manifest)}
    assert got["a.log"] is False and got["b.tmp"] is False


def test_opaque_dir_hides_the_lowers_gitignore(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"d/.gitignore": "*.o\n", "d/x.c": "c"})
    manifest = Manifest.take(lower)
    opaque(upper, "d")
    build(upper, {"d/x.o": "o"})
    got = {c.path: c.ignored for c in list_changes(lower, upper, manifest)}
    assert got["d/x.o"] is False


def test_tracked_files_are_never_ignored(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {"dist/app.js": "v1", "README": "r"})
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=lower, check=True)
    subprocess.run([*git, "add", "-f", "dist/app.js", "README"], cwd=lower, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=lower, check=True)
    manifest = Manifest.take(lower)
    build(upper, {"dist/app.js": "v2", "dist/new.js": "generated", "build/out": "x"})
    for use_git in (True, False):
        got = {c.path: c.ignored for c in listing(lower, upper, manifest, use_git=use_git)}
        assert got == {
            "dist/app.js": False,
            "dist/new.js": True,
            "build": True,
            "build/out": True,
        }, use_git


def test_rules_off(lu: tuple[Path, Path]) -> None:
    lower, upper = lu
    build(lower, {".gitignore": "*.log\n"})
    build(upper, {"a.log": "x", "node_modules/x": "x"})
    got = {c.path: c.ignored for c in listing(lower, upper, None, gitignore=False)}
    assert got == {"a.log": False, "node_modules": True, "node_modules/x": True}
    got = {c.path: c.ignored for c in listing(lower, upper, None, defaults=())}
    assert got == {"a.log": True, "node_modules": False, "node_modules/x": False}
