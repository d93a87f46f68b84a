"""Helpers for the workspace tests: build trees and synthetic overlay uppers, snapshot them."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from supervisor.state.workspace import Change

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts (mknod) and chown need root")


@dataclass(frozen=True)
class Link:
    target: str


@dataclass(frozen=True)
class Dir:
    mode: int = 0o755


@dataclass(frozen=True)
class Fifo:
    pass


@dataclass(frozen=True)
class File:
    data: bytes
    mode: int = 0o644


Spec = Mapping[str, bytes | str | Link | Dir | Fifo | File]


def build(root: Path, spec: Spec) -> None:
    """Create ``spec`` (relative path -> content) under ``root``; parents as needed."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, what in spec.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(what, Dir):
            path.mkdir(exist_ok=True)
            path.chmod(what.mode)
        elif isinstance(what, Link):
            os.symlink(what.target, path)
        elif isinstance(what, Fifo):
            os.mkfifo(path)
        elif isinstance(what, File):
            path.write_bytes(what.data)
            path.chmod(what.mode)
        else:
            path.write_bytes(what.encode() if isinstance(what, str) else what)


def whiteout(upper: Path, rel: str) -> None:
    """Overlay's deletion marker for ``rel``."""
    path = os.fsencode(upper) + b"/" + os.fsencode(rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o000, os.makedev(0, 0))


def opaque(upper: Path, rel: str, attr: str = "user.overlay.opaque") -> None:
    """Mark the upper directory ``rel`` opaque (``rm -rf d; mkdir d`` in the merged view)."""
    path = upper / rel
    path.mkdir(parents=True, exist_ok=True)
    os.setxattr(path, attr, b"y")


def snapshot(
    root: Path, *, times: bool = False, owners: bool = False, prune: Collection[str] = ()
) -> dict[str, tuple[object, ...]]:
    """path -> (type, mode, content or target[, owner][, mtime]) of every entry under root,
    but the relative paths in ``prune`` and what is under them (never entered)."""
    out: dict[str, tuple[object, ...]] = {}
    base = os.fsencode(root)

    def walk(d: bytes) -> None:
        for entry in os.scandir(d):
            path = entry.path
            st = os.lstat(path)
            rel = os.fsdecode(os.path.relpath(path, base))
            if rel in prune:
                continue
            extra: tuple[object, ...] = ()
            if owners:
                extra += (st.st_uid, st.st_gid)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.fsdecode(os.readlink(path)), *extra)
                continue
            mode = stat.S_IMODE(st.st_mode)
            if times and not stat.S_ISDIR(st.st_mode):
                extra += (st.st_mtime_ns,)
            if stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", mode, *extra)
                walk(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    out[rel] = ("file", mode, fh.read(), *extra)
            else:
                out[rel] = ("other", st.st_mode, st.st_rdev, *extra)

    walk(base)
    return out


def kinds(changes: list[Change]) -> dict[str, str]:
    return {c.path: c.kind for c in changes}


def by_path(changes: list[Change]) -> dict[str, Change]:
    return {c.path: c for c in changes}


OVERLAY_OPTS = "userxattr,redirect_dir=nofollow,index=off,metacopy=off,xino=off"


@contextlib.contextmanager
def kernel_overlay(lower: Path, upper: Path, work: Path, merged: Path) -> Iterator[Path]:
    """The runtime's overlay, mounted straight with mount(8) (no Docker)."""
    merged.mkdir(parents=True, exist_ok=True)
    opts = f"lowerdir={lower},upperdir={upper},workdir={work},{OVERLAY_OPTS}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)], check=True)
    try:
        yield merged
    finally:
        subprocess.run(["umount", str(merged)], check=True)


def can_mount_overlay(tmp: Path) -> bool:
    dirs = [tmp / n for n in ("l", "u", "w", "m")]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    try:
        with kernel_overlay(*dirs):
            return True
    except (subprocess.CalledProcessError, OSError):
        return False


def git_view(root: Path) -> dict[str, tuple[object, ...]]:
    """What git carries of a tree: files (bytes, exec bit) and symlinks; no directories."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, _dirs, files in os.walk(os.fsencode(root)):
        for name in files:
            path = os.path.join(dirpath, name)
            rel = os.fsdecode(os.path.relpath(path, os.fsencode(root)))
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.fsdecode(os.readlink(path)))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    out[rel] = ("file", bool(st.st_mode & stat.S_IXUSR), fh.read())
        for name in _dirs:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                out[os.fsdecode(os.path.relpath(path, os.fsencode(root)))] = (
                    "link",
                    os.fsdecode(os.readlink(path)),
                )
    return out


def git_apply(patch: str, where: Path, *args: str) -> None:
    patch_file = where.parent / f"{where.name}.patch"
    patch_file.write_text(patch)
    for check in (["--check"], []):
        proc = subprocess.run(
            ["git", "apply", *check, *args, str(patch_file)],
            cwd=where,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, (
            f"git apply {check} {args}: {proc.stderr}\n--- patch ---\n{patch[:4000]}"
        )
