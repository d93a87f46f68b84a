"""Who the workspace tests' projects belong to, when a case needs root, and the real non-root
user (docker group, 0700 home) that root's runs create to run things as (issue 22).

As root (CI), test projects are chowned to uid 1000, an ordinary user. As a non-root user
in the docker group, they are that user's own files: the set-up of a developer running the
supervisor as themselves. A case that needs root for its set-up (a mount, a file owned by
root, a directory under ``/usr``) and has no non-root equivalent is marked ``root_only``.
"""

from __future__ import annotations

import grp
import os
import pwd
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

AS_ROOT = os.geteuid() == 0
#: The uid:gid that owns the test projects: uid 1000 as root, else the user running the tests.
PROJECT_OWNER = (1000, 1000) if AS_ROOT else (os.geteuid(), os.getegid())
#: How a root-only case's skip reason starts (tests/e2e/test_workspace_nonroot.py allows
#: only these skips in its run as a non-root user).
ROOT_ONLY = "root-only: "

#: The non-root user root's runs create: a login with a 0700 home, in the docker group.
USER = "sandvisor-e2e"
UID = 1500


def root_only(reason: str) -> pytest.MarkDecorator:
    """Skip the case when not root, saying what of its set-up needs root."""
    return pytest.mark.skipif(not AS_ROOT, reason=ROOT_ONLY + reason)


def _root_run(*argv: str, timeout: float = 300) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


@dataclass
class HostUser:
    """A real user of this host, and how to run a command as it (its uid, its groups, its
    environment, in its home)."""

    name: str
    uid: int
    gid: int
    groups: list[int]
    home: Path
    env: dict[str, str]

    def run(
        self, *argv: str, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` as the user, its output captured; killed with what it started (a
        process group of its own) when it outlives ``timeout``."""
        proc = subprocess.Popen(
            list(argv),
            user=self.uid,
            group=self.gid,
            extra_groups=self.groups,
            env=self.env,
            cwd=cwd or self.home,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{argv} did not finish within {timeout} s:\n{out}\n{err}")
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    def ok(self, *argv: str, cwd: Path | None = None, timeout: float = 120) -> str:
        """``argv`` as the user; its stdout (it must exit 0, with no traceback)."""
        result = self.run(*argv, cwd=cwd, timeout=timeout)
        assert result.returncode == 0, (argv, result.returncode, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, result.stderr
        return result.stdout


@contextmanager
def docker_group_user() -> Iterator[HostUser]:
    """``USER`` (uid ``UID`` when free), in the docker group, with a 0700 home: created
    unless it exists, and then removed at the end (only if created here). Needs root:
    skipped otherwise (CI runs as root)."""
    if not AS_ROOT:
        pytest.skip("creates a user: needs root (CI runs as root)")
    try:
        docker_gid = grp.getgrnam("docker").gr_gid
    except KeyError:
        pytest.fail("no docker group: the engine's socket must be reachable by a group")
    created = False
    try:
        try:
            pwd.getpwnam(USER)
        except KeyError:
            uid_free = True
            try:
                pwd.getpwuid(UID)
                uid_free = False
            except KeyError:
                pass
            args = ["useradd", "-m", "-G", "docker", "-s", "/bin/sh"]
            _root_run(*args, *(["-u", str(UID)] if uid_free else []), USER)
            created = True
        entry = pwd.getpwnam(USER)
        home = Path(entry.pw_dir)
        home.chmod(0o700)
        env = {
            "HOME": str(home),
            "USER": USER,
            "LOGNAME": USER,
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", "CI"):
            if os.environ.get(name):
                env[name] = os.environ[name]
        yield HostUser(USER, entry.pw_uid, entry.pw_gid, [docker_gid], home, env)
    finally:
        if created:
            _root_run("userdel", "-r", USER)
