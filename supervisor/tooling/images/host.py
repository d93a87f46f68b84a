"""Host tools a build runs: subprocesses with their output, apt-get, scratch file removal."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from supervisor.tooling.images.catalogue import ImageBuildError
from supervisor.tooling.images.progress import Build


def run(
    argv: Sequence[str],
    what: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> str:
    """Run a short tool; its output on success, an ImageBuildError naming it on failure."""
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildError(f"{what}: {argv[0]} did not finish within {timeout:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n  ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise ImageBuildError(
            f"{what}: `{' '.join(argv)}` exited with {done.returncode}:\n  {tail}"
        )
    return done.stdout


def stream_lines(
    argv: Sequence[str], what: str, *, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Lines a long-running tool prints (stdout and stderr merged); raises when it fails."""
    tail: collections.deque[str] = collections.deque(maxlen=12)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            env=env,
        )
    except FileNotFoundError as exc:
        raise ImageBuildError(f"{what}: {argv[0]} is not installed") from exc
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            tail.append(line.rstrip())
            yield line
        code = proc.wait()
    finally:
        # Reached early on Ctrl-C or a consumer error: the tool must not outlive the build.
        stop(proc)
        proc.stdout.close()
    if code != 0:
        lines = "\n  ".join(t for t in tail if t)
        raise ImageBuildError(f"{what} failed (exit {code}); last output:\n  {lines}")


def stop(proc: subprocess.Popen[Any]) -> None:
    """Terminate a tool that is still running, killing it when it ignores that."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def which(tool: str) -> str | None:
    """``shutil.which`` that also looks in the sbin directories."""
    # Non-login root shells often lack the sbin directories where debootstrap lives.
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return shutil.which(tool, path=path)


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


def apt(args: Sequence[str], what: str, b: Build, *, cwd: Path | None = None) -> None:
    """apt-get, refreshing the package lists once when they are missing or stale."""
    argv = ["apt-get", *args]
    if os.geteuid() == 0:
        # As root apt downloads as the _apt user, which cannot write into our build folder.
        argv[1:1] = ["-o", "APT::Sandbox::User=root"]
    try:
        run(argv, what, cwd=cwd, env=_apt_env())
    except ImageBuildError as exc:
        if os.geteuid() != 0 or "apt-get is not installed" in str(exc):
            raise
        b.detail("apt-get update")
        run(["apt-get", "update"], f"{what}: apt-get update", env=_apt_env())
        run(argv, what, cwd=cwd, env=_apt_env())


def remove(path: Path) -> None:
    """Delete a file, symlink or folder without following symlinks out of a chroot."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path)


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory).rstrip("/") + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 1:
                target = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
                if target.startswith(prefix):
                    found.append(target)
    return sorted(found, key=len, reverse=True)


def remove_tree(directory: Path) -> None:
    """Delete a scratch folder, first unmounting what a failed debootstrap left mounted in it."""
    for target in _mounts_under(directory):
        with contextlib.suppress(ImageBuildError):
            run(["umount", "-l", target], f"unmount {target}", timeout=60)
    if _mounts_under(directory):
        # rmtree would descend into a still-mounted /proc or /sys of the chroot.
        raise ImageBuildError(f"cannot unmount everything under {directory}; remove it by hand")
    shutil.rmtree(directory, ignore_errors=True)
