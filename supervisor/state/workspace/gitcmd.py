"""The few git questions the workspace engine asks: tracked files, ignored paths.

Run as the lower's owner with no user or system configuration, so the answers are the
project's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

#: A git call that takes longer gives up (the pure-Python matcher answers instead).
GIT_TIMEOUT_S = 120.0


def find_repo(lower: Path) -> Path | None:
    """The repository root holding ``lower`` (itself or an ancestor with a ``.git``)."""
    path = Path(os.path.realpath(lower))
    for candidate in (path, *path.parents):
        if os.path.lexists(candidate / ".git"):
            return candidate
    return None


def _git() -> str | None:
    return shutil.which("git")


def _env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
    }


def _run(lower: Path, args: Sequence[str], stdin: bytes = b"") -> bytes | None:
    """stdout of ``git args`` run in ``lower``; None when git is missing or fails.

    As root it runs as the owner of ``lower`` (git then trusts the repository, and nothing
    the project's configuration might run gets root); ``core.fsmonitor`` is off because
    it names a program to run."""
    git = _git()
    if git is None:
        return None
    argv = [
        git,
        "-c",
        "safe.directory=*",
        "-c",
        "core.fsmonitor=false",
        "-c",
        "core.quotePath=false",
        *args,
    ]
    kwargs: dict[str, object] = {}
    st = os.stat(lower)
    if os.geteuid() == 0 and st.st_uid != 0:
        kwargs = {"user": st.st_uid, "group": st.st_gid, "extra_groups": []}
    try:
        proc = subprocess.run(  # type: ignore[call-overload]
            argv,
            input=stdin,
            cwd=lower,
            env=_env(),
            capture_output=True,
            timeout=GIT_TIMEOUT_S,
            check=False,
            **kwargs,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("workspace.git_failed", args=list(args[:2]), error=str(exc))
        return None
    out: bytes = proc.stdout
    if proc.returncode not in (0, 1):
        log.info(
            "workspace.git_failed",
            args=list(args[:2]),
            rc=proc.returncode,
            stderr=proc.stderr.decode("utf-8", "replace")[-500:],
        )
        return None
    return out


def tracked_files(lower: Path) -> list[str] | None:
    """Paths git tracks under ``lower`` (relative to it); None without git or a repository."""
    if find_repo(lower) is None:
        return None
    out = _run(lower, ["ls-files", "-z", "--"])
    if out is None:
        return None
    return [os.fsdecode(p) for p in out.split(b"\0") if p]


def check_ignore(
    lower: Path, paths: Sequence[tuple[str, bool]], defaults: Sequence[str]
) -> tuple[set[str], set[str]] | None:
    """Which of ``paths`` ((relative path, is a directory)) git's ignore rules exclude:
    ``defaults`` as ``core.excludesFile``, ``.git/info/exclude`` and the ``.gitignore``
    files in ``lower`` and above it, without the index (tracked files are the caller's
    business). Returns (ignored, unsure); None when git cannot answer (no git or
    repository, a path beyond a symlink or inside a submodule, a timeout): ask the
    pure-Python matcher then.

    A directory is asked as ``dir/``: git then also matches the bare ``dir/`` with an
    empty last component, which a blank pattern (a line of spaces) matches; such answers
    are returned as unsure. The type of each path comes from the lower (git stats it), so
    a directory the lower lacks should not be asked."""
    if not paths or find_repo(lower) is None or _git() is None:
        return None
    with tempfile.NamedTemporaryFile("w", prefix="sandvisor-excludes-", delete=False) as fh:
        fh.write("".join(f"{line}\n" for line in defaults))
        excludes = fh.name
    try:
        os.chmod(excludes, 0o644)  # readable by the owner git runs as
        # "./" keeps a name starting with ':' from being read as pathspec magic.
        query = b"".join(
            b"./" + os.fsencode(p) + (b"/" if is_dir else b"") + b"\0" for p, is_dir in paths
        )
        out = _run(
            lower,
            [
                "-c",
                f"core.excludesFile={excludes}",
                "check-ignore",
                "--stdin",
                "-z",
                "--no-index",
                "--verbose",
            ],
            query,
        )
    finally:
        os.unlink(excludes)
    if out is None:
        return None
    fields = out.split(b"\0")
    ignored: set[str] = set()
    unsure: set[str] = set()
    # --verbose -z: source, line number, pattern, path; negated matches are listed too.
    for i in range(0, len(fields) - 3, 4):
        pattern, item = fields[i + 2], fields[i + 3]
        path = os.fsdecode(item[2:] if item.startswith(b"./") else item)
        if not pattern.removeprefix(b"!").removesuffix(b"/"):  # printed as "", "/" or "!"
            unsure.add(path.removesuffix("/"))
        elif not pattern.startswith(b"!"):
            ignored.add(path.removesuffix("/"))
    return ignored, unsure
