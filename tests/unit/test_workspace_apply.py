"""apply / undo round trips, containment attacks, conflicts, rollback, and the cleanup
functions, on synthetic uppers."""

from __future__ import annotations

import base64
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.state.workspace import (
    Manifest,
    NoBackup,
    UnsafeWorkspacePath,
    WorkspaceConflict,
    WorkspaceError,
    apply,
    discard,
    display_path,
    latest_backup,
    list_changes,
    prune_upper,
    remove_workspace,
    reset_upper,
    undo,
)
from supervisor.state.workspace import applier as apply_module
from tests.unit.workspace_tools import (
    Dir,
    Fifo,
    File,
    Link,
    build,
    needs_root,
    opaque,
    snapshot,
    whiteout,
)

pytestmark = needs_root
OWNER = (1234, 4321)


class WS:
    """A lower, an upper and a backup folder; the backup on another filesystem when asked."""

    def __init__(self, root: Path, backup: Path) -> None:
        self.lower = root / "lower"
        self.upper = root / "upper"
        self.work = root / "work"
        self.backup = backup
        for d in (self.lower, self.upper, self.work):
            d.mkdir(parents=True)

    def manifest(self) -> Manifest:
        return Manifest.take(self.lower)

    def changes(self, manifest: Manifest | None = None):
        return list_changes(self.lower, self.upper, manifest or self.manifest())

    def apply(self, manifest: Manifest | None = None, **kw: object):
        changes = self.changes(manifest)
        return apply(self.lower, self.upper, changes, self.backup, owner=OWNER, **kw)  # type: ignore[arg-type]


@pytest.fixture(params=["same-fs", "other-fs"])
def ws(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[WS]:
    """Backups by hard link and rename (same filesystem) or by exact copy (/dev/shm)."""
    if request.param == "same-fs":
        yield WS(tmp_path, tmp_path / "backup")
        return
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem for the backup")
    backup = shm / f"sandvisor-test-backup-{os.getpid()}-{tmp_path.name}"
    try:
        yield WS(tmp_path, backup)
    finally:
        subprocess.run(["rm", "-rf", str(backup)], check=False)


LOWER = {
    "keep.txt": "unchanged\n",
    "edit.txt": "old\n",
    "script.sh": File(b"#!/bin/sh\necho hi\n", 0o644),
    "gone.txt": "bye\n",
    "gonedir/a": "a",
    "gonedir/sub/b": File(b"b", 0o600),
    "gonedir/ln": Link("a"),
    "link": Link("keep.txt"),
    "f2d": "was a file",
    "d2f/x": "x",
    "opq/old": "old",
    "opq/same": "same",
    "hard1": "hard",
    "dirmode": Dir(0o755),
}


def agent(upper: Path) -> None:
    """What a task did, as the overlay records it."""
    build(
        upper,
        {
            "edit.txt": "new\n",
            "script.sh": File(b"#!/bin/sh\necho hi\n", 0o755),
            "new.txt": "hello\n",
            "newdir/inner/deep.txt": "deep",
            "newdir/empty": Dir(0o700),
            "link": Link("edit.txt"),
            "f2d/child": "c",
            "d2f": "now a file",
            "opq/same": "same",
            "opq/new": "new",
            "dirmode": Dir(0o750),
            "-rf": "option-like",
            "--force": "option-like",
            "new\nline": "newline",
            "caf\udce9": "latin-1 name",
        },
    )
    whiteout(upper, "gone.txt")
    whiteout(upper, "gonedir")
    os.setxattr(upper / "opq", "user.overlay.opaque", b"y")


def expected_merged() -> dict[str, tuple[object, ...]]:
    """The merged view the agent saw, as a snapshot (modes as apply writes them)."""
    return {
        "keep.txt": ("file", 0o644, b"unchanged\n"),
        "edit.txt": ("file", 0o644, b"new\n"),
        "script.sh": ("file", 0o755, b"#!/bin/sh\necho hi\n"),
        "new.txt": ("file", 0o644, b"hello\n"),
        "newdir": ("dir", 0o755),
        "newdir/inner": ("dir", 0o755),
        "newdir/inner/deep.txt": ("file", 0o644, b"deep"),
        "newdir/empty": ("dir", 0o700),
        "link": ("link", "edit.txt"),
        "f2d": ("dir", 0o755),
        "f2d/child": ("file", 0o644, b"c"),
        "d2f": ("file", 0o644, b"now a file"),
        "opq": ("dir", 0o755),
        "opq/same": ("file", 0o644, b"same"),
        "opq/new": ("file", 0o644, b"new"),
        "hard1": ("file", 0o644, b"hard"),
        "dirmode": ("dir", 0o750),
        "-rf": ("file", 0o644, b"option-like"),
        "--force": ("file", 0o644, b"option-like"),
        "new\nline": ("file", 0o644, b"newline"),
        "caf\udce9": ("file", 0o644, b"latin-1 name"),
    }


def test_apply_then_undo_round_trip(ws: WS) -> None:
    build(ws.lower, LOWER)
    os.link(ws.lower / "hard1", ws.lower / "hard2")  # a hard link in the lower survives undo
    ws_before = snapshot(ws.lower, times=True, owners=True)
    inode = os.lstat(ws.lower / "edit.txt").st_ino
    manifest = ws.manifest()
    agent(ws.upper)
    result = ws.apply(manifest)
    got = snapshot(ws.lower)
    want = expected_merged() | {"hard2": ("file", 0o644, b"hard")}
    assert got == want
    assert result.deleted == 3 and result.mode_changed == 2 and result.skipped == []
    assert result.overwritten >= 4 and result.created >= 9
    # Everything apply wrote belongs to the owner; what it did not touch keeps its owner.
    for rel in ("new.txt", "newdir", "newdir/inner/deep.txt", "link", "edit.txt", "-rf"):
        st = os.lstat(ws.lower / rel)
        assert (st.st_uid, st.st_gid) == OWNER, rel
    assert os.lstat(ws.lower / "keep.txt").st_uid == 0
    undo_result = undo(ws.lower, ws.backup)
    assert "edit.txt" in undo_result.restored and "new.txt" in undo_result.removed
    assert snapshot(ws.lower, times=True, owners=True) == ws_before
    assert os.lstat(ws.lower / "hard1").st_ino == os.lstat(ws.lower / "hard2").st_ino
    if os.stat(ws.backup.parent).st_dev == os.stat(ws.lower).st_dev:
        assert os.lstat(ws.lower / "edit.txt").st_ino == inode  # the very same file came back
    assert latest_backup(ws.backup) is None
    with pytest.raises(NoBackup):
        undo(ws.lower, ws.backup)


def test_two_applies_undo_newest_first(ws: WS) -> None:
    build(ws.lower, {"a": "0"})
    before = snapshot(ws.lower)
    build(ws.upper, {"a": "1"})
    ws.apply()
    reset_upper(ws.upper, ws.work, ws.lower)
    build(ws.upper, {"a": "2", "b": "new"})
    ws.apply()
    assert snapshot(ws.lower)["a"] == ("file", 0o644, b"2")
    undo(ws.lower, ws.backup)
    assert snapshot(ws.lower) == {"a": ("file", 0o644, b"1")}
    undo(ws.lower, ws.backup)
    assert snapshot(ws.lower) == before


def test_nothing_to_apply(ws: WS) -> None:
    build(ws.lower, {"a": "same"})
    build(ws.upper, {"a": "same"})
    result = ws.apply()
    assert result.applied == [] and snapshot(ws.lower) == {"a": ("file", 0o644, b"same")}


# -- containment --------------------------------------------------------------------------


def test_a_symlink_planted_in_the_upper_is_copied_never_followed(ws: WS, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("host secret\n")
    build(ws.lower, {"x": "lower"})
    build(ws.upper, {"x": Link("/etc/passwd"), "esc": Link("../../x"), "out": Link(str(outside))})
    passwd = Path("/etc/passwd").read_bytes()
    ws.apply()
    assert os.readlink(ws.lower / "x") == "/etc/passwd"
    assert os.readlink(ws.lower / "esc") == "../../x"
    assert Path("/etc/passwd").read_bytes() == passwd
    assert outside.read_text() == "host secret\n"
    undo(ws.lower, ws.backup)
    assert (ws.lower / "x").read_text() == "lower"


def test_a_lower_dir_swapped_for_a_symlink_is_refused(ws: WS, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    build(ws.lower, {"ok.txt": "ok", "escape/f": "f", "inside/f": "f", "real/f": "f"})
    manifest = ws.manifest()
    build(ws.upper, {"ok.txt": "changed", "escape/pwned": "x", "inside/f": "g"})
    changes = ws.changes(manifest)
    # Between the listing and the apply the host turns directories into symlinks, one
    # out of the tree, one within it: apply never writes through either.
    subprocess.run(["rm", "-rf", str(ws.lower / "escape"), str(ws.lower / "inside")], check=True)
    os.symlink(outside, ws.lower / "escape")
    os.symlink("real", ws.lower / "inside")
    before = snapshot(ws.lower)
    with pytest.raises(UnsafeWorkspacePath, match="symlink") as info:
        apply(ws.lower, ws.upper, changes, ws.backup, owner=OWNER, force=True)
    assert set(info.value.paths) == {"escape/pwned", "inside/f"}
    assert snapshot(ws.lower) == before  # nothing written, not even ok.txt
    assert list(outside.iterdir()) == []
    assert latest_backup(ws.backup) is None


def test_an_upper_dir_over_a_lower_symlink_replaces_the_link(ws: WS, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    build(ws.lower, {"escape": Link(str(outside))})
    build(ws.upper, {"escape/pwned": "x"})  # in the merged view "escape" became a directory
    got = ws.changes()
    assert (got[0].path, got[0].kind, got[0].old_type) == ("escape", "replaced", "symlink")
    ws.apply()
    assert (ws.lower / "escape").is_dir() and not (ws.lower / "escape").is_symlink()
    assert list(outside.iterdir()) == []
    undo(ws.lower, ws.backup)
    assert os.readlink(ws.lower / "escape") == str(outside)


def test_paths_with_dotdot_or_absolute_are_refused(ws: WS) -> None:
    build(ws.upper, {"a": "x"})
    change = ws.changes()[0]
    for bad in ("../a", "/etc/passwd", "a/../../b", "", "a//b", "./a"):
        change.path = bad
        with pytest.raises(UnsafeWorkspacePath):
            apply(ws.lower, ws.upper, [change], ws.backup, owner=OWNER)


def test_a_mount_point_in_the_lower_is_refused(ws: WS) -> None:
    build(ws.lower, {"mnt/.keep": "", "other": "x"})
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(ws.lower / "mnt")], check=True
    )
    try:
        (ws.lower / "mnt" / "host-data").write_text("on the mounted filesystem")
        manifest = ws.manifest()
        build(ws.upper, {"mnt/new": "x"})
        got = ws.changes(manifest)
        assert all("mounted" in (c.note or "") for c in got)
        with pytest.raises(UnsafeWorkspacePath, match="mounted"):
            apply(ws.lower, ws.upper, got, ws.backup, owner=OWNER)
        # Deleting the tree holding the mount point is refused too.
        subprocess.run(["rm", "-rf", str(ws.upper / "mnt")], check=True)
        whiteout(ws.upper, "mnt")
        with pytest.raises(UnsafeWorkspacePath, match="mount"):
            ws.apply(manifest)
        assert (ws.lower / "mnt" / "host-data").exists()
    finally:
        subprocess.run(["umount", str(ws.lower / "mnt")], check=True)


def test_hard_links_fifos_and_setuid(ws: WS) -> None:
    build(ws.upper, {"a": File(b"data", 0o4755), "g": File(b"g", 0o2775), "fifo": Fifo()})
    os.link(ws.upper / "a", ws.upper / "b")
    os.mknod(ws.upper / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    result = ws.apply()
    assert {s.path: s.reason for s in result.skipped} == {
        "fifo": "special_file",
        "null": "special_file",
    }
    a, b = os.lstat(ws.lower / "a"), os.lstat(ws.lower / "b")
    assert a.st_ino != b.st_ino  # content copied, not linked
    # setuid/setgid stripped; group write too, as the host had no file there.
    assert (
        stat.S_IMODE(a.st_mode) == 0o755 and stat.S_IMODE(os.lstat(ws.lower / "g").st_mode) == 0o755
    )
    assert not (ws.lower / "fifo").exists() and not (ws.lower / "null").exists()


def test_protected_git_paths_are_never_applied(ws: WS) -> None:
    build(ws.lower, {".git/config": "[core]\n", "sub/.git/hooks/x": "old"})
    build(
        ws.upper,
        {
            ".git/config": "[core]\nhooksPath=/tmp/evil\n",
            ".git/hooks/pre-commit": "#!/bin/sh\nevil\n",
            "sub/.git/hooks/x": "evil",
            ".git/HEAD": "ref",
        },
    )
    result = ws.apply(include_ignored=True)
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons[".git/config"] == "protected" and reasons[".git/hooks"] == "protected"
    assert reasons["sub/.git/hooks/x"] == "protected"
    assert (ws.lower / ".git" / "config").read_text() == "[core]\n"
    assert not (ws.lower / ".git" / "hooks").exists()
    assert (ws.lower / "sub" / ".git" / "hooks" / "x").read_text() == "old"
    assert (ws.lower / ".git" / "HEAD").read_text() == "ref"  # the rest of .git is ordinary


def test_ignored_changes_wait_for_include_ignored(ws: WS) -> None:
    build(ws.upper, {"src/m.py": "code", "node_modules/x/i.js": "dep"})
    result = ws.apply()
    assert (ws.lower / "src" / "m.py").exists() and not (ws.lower / "node_modules").exists()
    assert {s.reason for s in result.skipped} == {"ignored"}
    ws.apply(include_ignored=True)
    assert (ws.lower / "node_modules" / "x" / "i.js").read_text() == "dep"


def test_a_huge_file(ws: WS) -> None:
    big = ws.upper / "big.bin"
    with big.open("wb") as fh:
        fh.truncate(64 << 20)
        fh.seek(32 << 20)
        fh.write(b"middle")
    ws.apply()
    assert (ws.lower / "big.bin").stat().st_size == 64 << 20
    with (ws.lower / "big.bin").open("rb") as fh:
        fh.seek(32 << 20)
        assert fh.read(6) == b"middle"


# -- conflicts ----------------------------------------------------------------------------


def test_conflict_refused_then_forced_then_undone(ws: WS) -> None:
    build(ws.lower, {"shared.txt": "original\n", "mine.txt": "original\n"})
    manifest = ws.manifest()
    build(ws.upper, {"shared.txt": "agent\n", "mine.txt": "agent\n"})
    (ws.lower / "shared.txt").write_text("host edit\n")  # the user kept working
    host_state = snapshot(ws.lower)
    with pytest.raises(WorkspaceConflict) as info:
        ws.apply(manifest)
    assert info.value.paths == ["shared.txt"]
    assert snapshot(ws.lower) == host_state and latest_backup(ws.backup) is None
    result = ws.apply(manifest, force=True)
    assert result.forced == ["shared.txt"]
    assert (ws.lower / "shared.txt").read_text() == "agent\n"
    undo(ws.lower, ws.backup)
    assert snapshot(ws.lower) == host_state  # the host's edit is back


def test_conflicts_are_rechecked_at_apply_time(ws: WS) -> None:
    build(ws.lower, {"a": "1"})
    manifest = ws.manifest()
    build(ws.upper, {"a": "agent"})
    changes = ws.changes(manifest)
    assert not changes[0].conflict
    (ws.lower / "a").write_text("host, after the listing")
    with pytest.raises(WorkspaceConflict):
        apply(ws.lower, ws.upper, changes, ws.backup, owner=OWNER, manifest=manifest)
    assert (ws.lower / "a").read_text() == "host, after the listing"


def test_undo_refuses_to_overwrite_later_host_edits(ws: WS) -> None:
    build(ws.lower, {"a": "1", "b": "1"})
    build(ws.upper, {"a": "2", "b": "2", "c": "new"})
    ws.apply()
    (ws.lower / "a").write_text("host after apply")
    with pytest.raises(WorkspaceConflict, match="since the apply"):
        undo(ws.lower, ws.backup)
    assert (ws.lower / "b").read_text() == "2"
    result = undo(ws.lower, ws.backup, force=True)
    assert result.kept == ["a"]
    assert snapshot(ws.lower) == {
        "a": ("file", 0o644, b"host after apply"),
        "b": ("file", 0o644, b"1"),
    }


def test_stale_listing_is_refused(ws: WS) -> None:
    build(ws.upper, {"a": "1", "b": "2"})
    changes = ws.changes()
    (ws.upper / "b").unlink()
    with pytest.raises(WorkspaceError, match="list them again"):
        apply(ws.lower, ws.upper, changes, ws.backup, owner=OWNER)
    assert not (ws.lower / "a").exists()


# -- failures -----------------------------------------------------------------------------


def test_a_failure_midway_rolls_everything_back(ws: WS, monkeypatch: pytest.MonkeyPatch) -> None:
    build(ws.lower, LOWER)
    before = snapshot(ws.lower, times=True, owners=True)
    agent(ws.upper)
    real = apply_module._Run._place
    calls = {"n": 0}

    def flaky(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 6:
            raise OSError(28, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(apply_module._Run, "_place", flaky)
    with pytest.raises(OSError, match="No space"):
        ws.apply()
    assert snapshot(ws.lower, times=True, owners=True) == before
    assert latest_backup(ws.backup) is None
    assert not list(ws.lower.rglob(".sandvisor-*"))


def test_undo_after_a_crash_midway(ws: WS) -> None:
    build(ws.lower, LOWER)
    before = snapshot(ws.lower, times=True, owners=True)
    agent(ws.upper)
    changes = ws.changes()
    pid = os.fork()
    if pid == 0:  # the child dies hard while a temporary file is half written
        real = apply_module.copy_data
        calls = {"n": 0}

        def dies(src: int, dst: int) -> int:
            calls["n"] += 1
            if calls["n"] == 5:
                os._exit(3)
            return real(src, dst)

        apply_module.copy_data = dies  # type: ignore[assignment]
        try:
            apply(ws.lower, ws.upper, changes, ws.backup, owner=OWNER)
        finally:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 3
    assert snapshot(ws.lower) != before
    assert list(ws.lower.rglob(".sandvisor-apply-*"))
    undo(ws.lower, ws.backup)  # the journal is enough
    assert snapshot(ws.lower, times=True, owners=True) == before


# -- cleanup ------------------------------------------------------------------------------


def test_reset_upper_empties_robustly_and_sets_the_root(tmp_path: Path) -> None:
    ws = WS(tmp_path, tmp_path / "backup")
    os.chown(ws.lower, 1000, 1000)
    ws.lower.chmod(0o751)
    (ws.work / "work").mkdir(mode=0)
    build(ws.upper, {"a/b/c": "x", "locked/x": "y"})
    (ws.upper / "locked").chmod(0)
    fd = os.open(ws.upper, os.O_RDONLY)
    for _ in range(300):  # deeper than any walk goes
        os.mkdir("d", dir_fd=fd)
        nxt = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nxt
    os.close(fd)
    reset_upper(ws.upper, ws.work, ws.lower)
    assert list(ws.upper.iterdir()) == [] and list(ws.work.iterdir()) == []
    st = os.stat(ws.upper)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (1000, 1000, 0o751)
    reset_upper(ws.upper, ws.work, owner=(65534, 65534), mode=0o755)
    assert os.stat(ws.upper).st_uid == 65534


def test_discard_and_remove_workspace(tmp_path: Path) -> None:
    root = tmp_path / "ws" / "s1"
    ws = WS(root, root / "backup")
    build(ws.lower, {"a": "1"})
    build(ws.upper, {"a": "2"})
    ws.apply()
    reset_upper(ws.upper, ws.work, ws.lower)
    build(ws.upper, {"b": "pending"})
    discard(ws.upper, ws.work, ws.backup, ws.lower)
    assert list(ws.upper.iterdir()) == [] and not ws.backup.exists()
    assert (ws.lower / "a").read_text() == "2"
    remove_workspace(root)
    assert not root.exists()
    remove_workspace(root)  # already gone: fine
    for bad in ("/", "relative/path"):
        with pytest.raises(UnsafeWorkspacePath):
            remove_workspace(bad)


def test_opaque_directory_apply(ws: WS) -> None:
    build(ws.lower, {"d/old": "o", "d/keep": "k", "d/sub/x": "x"})
    before = snapshot(ws.lower)
    opaque(ws.upper, "d")
    build(ws.upper, {"d/keep": "k", "d/new": "n"})
    ws.apply()
    assert snapshot(ws.lower) == {
        "d": ("dir", 0o755),
        "d/keep": ("file", 0o644, b"k"),
        "d/new": ("file", 0o644, b"n"),
    }
    undo(ws.lower, ws.backup)
    assert snapshot(ws.lower) == before


def test_prune_keeps_what_apply_skipped(ws: WS) -> None:
    build(ws.lower, {"src/a.py": "1", "opq/old.o": "o", "opq/x": "x"})
    build(
        ws.upper, {"src/a.py": "2", "src/b.py": "new", "node_modules/m/i.js": "dep", "fifo": Fifo()}
    )
    opaque(ws.upper, "opq")
    build(ws.upper, {"opq/x": "x2", "opq/build/out": "ignored"})
    changes = ws.changes()
    apply(ws.lower, ws.upper, changes, ws.backup, owner=OWNER)
    stay = prune_upper(ws.upper, ws.work, changes)
    left = sorted(str(p.relative_to(ws.upper)) for p in ws.upper.rglob("*"))
    # src is in the lower now; node_modules and the fifo were skipped; the opaque opq holds
    # an ignored build/, so it stays whole (it hides the lower's directory).
    assert left == [
        "fifo",
        "node_modules",
        "node_modules/m",
        "node_modules/m/i.js",
        "opq",
        "opq/build",
        "opq/build/out",
        "opq/x",
    ]
    assert stay == 3


def test_apply_refuses_what_was_not_reviewed(tmp_path: Path) -> None:
    """Item 7 of the workspace review: ``reviewed`` (review_key -> digest) must match the
    changes apply would write; a name that is not UTF-8 is keyed by its bytes."""
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    lower.mkdir()
    upper.mkdir()
    (lower / "a.txt").write_text("a\n")
    manifest = Manifest.take(lower, tracked=())
    odd = os.fsdecode(b"odd-\xff.txt")
    (upper / "a.txt").write_text("a2\n")
    (upper / odd).write_text("odd\n")
    listed = list_changes(lower, upper, manifest)
    keys = {c.review_key: c.digest for c in listed}
    assert set(keys) == {"a.txt", "b64:" + base64.b64encode(b"odd-\xff.txt").decode()}
    (upper / "a.txt").write_text("a3\n")  # written after the review
    now = list_changes(lower, upper, manifest)
    with pytest.raises(WorkspaceConflict, match="1 change\\(s\\) differ from what was reviewed"):
        apply(lower, upper, now, tmp_path / "b", owner=(0, 0), manifest=manifest, reviewed=keys)
    assert (lower / "a.txt").read_text() == "a\n" and not (lower / odd).exists()
    gone = {**keys, "never-listed.txt": "0" * 64}
    with pytest.raises(WorkspaceConflict, match="never-listed"):
        apply(lower, upper, now, tmp_path / "b", owner=(0, 0), manifest=manifest, reviewed=gone)
    fresh = {c.review_key: c.digest for c in now}
    result = apply(
        lower, upper, now, tmp_path / "b", owner=(0, 0), manifest=manifest, reviewed=fresh
    )
    assert sorted(result.applied) == sorted(["a.txt", display_path(odd)])


def test_group_and_other_write_only_where_the_host_had_them(tmp_path: Path) -> None:
    """Item 15 of the workspace review: ``chmod 0777`` in the sandbox does not make a
    world-writable directory or file on the host; a host entry that was group-writable
    keeps that bit."""
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    (lower / "sub").mkdir(parents=True)
    (lower / "shared.txt").write_text("s\n")
    (lower / "shared.txt").chmod(0o664)
    (lower / "sub").chmod(0o755)
    manifest = Manifest.take(lower, tracked=())
    (upper / "sub").mkdir(parents=True)
    (upper / "sub").chmod(0o777)
    (upper / "new").mkdir()
    (upper / "new").chmod(0o777)
    (upper / "new" / "f.txt").write_text("f\n")
    (upper / "new" / "f.txt").chmod(0o666)
    (upper / "shared.txt").write_text("s2\n")
    (upper / "shared.txt").chmod(0o666)
    found = list_changes(lower, upper, manifest)
    apply(lower, upper, found, tmp_path / "b", owner=(0, 0), manifest=manifest)
    modes = {p: stat.S_IMODE((lower / p).stat().st_mode) for p in ("sub", "new", "new/f.txt")}
    assert modes == {"sub": 0o755, "new": 0o755, "new/f.txt": 0o644}
    assert stat.S_IMODE((lower / "shared.txt").stat().st_mode) == 0o664  # the host had g+w
