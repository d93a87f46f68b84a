"""The workspace tests again, as a real non-root user (issue 22: they run twice in ``make
test``, as root with a project under /root, and as a docker-group user with a 0700 home).

As root (CI), this takes ``tests/users.py``'s user (created unless it exists, removed at the
end only if created here), gives it a venv of its own with the supervisor's dependencies
and pytest, and runs pytest as that user over ``WORKSPACE_TESTS``: the code is this
checkout's (``PYTHONPATH``; copied only when the user cannot read the checkout), the state
and tmp dirs are under the user's home (``--basetemp``, short enough for AF_UNIX paths),
``CI=1``. The projects are the user's own files (``tests.users.PROJECT_OWNER``).

The test venv cannot serve: its interpreter lives under root's 0700 home. The user's venv
is made with the system ``python3`` (3.11, as the test venv) and filled offline from a
wheelhouse built here, every version pinned to the test venv's (``pip freeze``).

runc only (``-k "not runsc"``): on both runtimes the inner run took 263 s (67 passed), on
runc 131 s (46 passed), plus about 30-45 s of set-up. What the user changes (ownership,
permission bits, the state dir and its cleanup, the daemon's socket) is the supervisor's
host side, the same for both runtimes; the root run covers runsc.

Passes when the inner run has no failure or error, at least ``FLOOR`` tests passed, every
skip is a declared root-only case (``tests.users.root_only``) and every xfail one of
``OPEN_BUGS``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import require_engine
from tests.users import ROOT_ONLY, HostUser, docker_group_user

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.serial(
        "its inner run is the workspace arena cases, which check the host's processes, "
        "memory and free disk; other workers' tests move those machine-wide numbers"
    ),
]

REPO = Path(__file__).resolve().parents[2]
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check")
#: The workspace tests: adversarial, e2e through the API, CLI and MCP, and integration.
WORKSPACE_TESTS = (
    "tests/adversarial/test_workspace_attacks.py",
    "tests/adversarial/test_workspace_host.py",
    "tests/e2e/test_workspace_api.py",
    "tests/e2e/test_workspace_cli.py",
    "tests/e2e/test_workspace_mcp.py",
    "tests/integration/workspaces",
)
#: What the inner run needs besides the package's own dependencies.
TEST_DEPS = ("pytest", "pytest-asyncio", "pytest-timeout", "hypothesis")
#: What of the checkout the inner run reads (when it has to be copied).
CHECKOUT = ("pyproject.toml", "supervisor", "tests", "policies", "sandbox_images")
#: Fewer passed tests than this and the run proves nothing (47 passed on 2026-12-07: a new
#: root-only case, or a file left out, fails this until the floor is lowered on purpose).
FLOOR = 47
#: Tests that fail without root for a bug not fixed yet: xfail(strict, not run) there
#: (none now: chmod 000 of the layer's root and of a directory was the last, fixed 2026-12-07).
OPEN_BUGS: set[str] = set()


@dataclass
class Outcome:
    """What the inner run's junit XML says, by node id."""

    passed: list[str]
    failed: dict[str, str]
    skipped: dict[str, str]
    xfailed: dict[str, str]
    seconds: float


def _root_run(*argv: str, timeout: float = 300) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def _readable_tree(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.fixture(scope="module")
def runner() -> Iterator[tuple[HostUser, Path]]:
    """The user with its venv, and the checkout it can read."""
    with docker_group_user() as host:
        require_engine()
        work = Path(tempfile.mkdtemp(prefix="sandvisor-nonroot-"))
        top = host.home / "ws-tests"
        try:
            # The wheelhouse: the package's dependencies and pytest's, at the test venv's versions.
            pins = work / "constraints.txt"
            pins.write_text(_root_run(*PIP, "freeze", "--exclude-editable"))
            needed = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
            wheelhouse = work / "wheelhouse"
            _root_run(
                *PIP, "wheel", "-q", "-c", str(pins), "-w", str(wheelhouse),
                *needed["dependencies"], *TEST_DEPS,
            )  # fmt: skip
            checkout = REPO
            if host.run("test", "-r", str(REPO / "pyproject.toml")).returncode != 0:
                checkout = work / "checkout"  # e.g. under root's 0700 home
                for name in CHECKOUT:
                    src, dst = REPO / name, checkout / name
                    if src.is_dir():
                        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
                    else:
                        checkout.mkdir(exist_ok=True)
                        shutil.copy2(src, dst)
            _readable_tree(work)
            shutil.rmtree(top, ignore_errors=True)  # a previous run's
            host.ok("mkdir", "-m", "700", str(top))
            venv = top / "venv"
            host.ok("/usr/bin/python3", "-m", "venv", str(venv))
            host.ok(
                str(venv / "bin" / "pip"), "install", "-q", "--no-index",
                "--find-links", str(wheelhouse), "-c", str(pins),
                *needed["dependencies"], *TEST_DEPS, timeout=300,
            )  # fmt: skip
            yield host, checkout
        finally:
            shutil.rmtree(top, ignore_errors=True)  # as root: the kernel's leftovers too
            shutil.rmtree(work, ignore_errors=True)


def _outcome(junit: Path) -> Outcome:
    suite = ET.parse(junit).getroot()
    if suite.tag == "testsuites":
        suite = suite[0]
    out = Outcome([], {}, {}, {}, float(suite.get("time", "0")))
    for case in suite.iter("testcase"):
        path = (case.get("classname") or "").replace(".", "/")
        nodeid = f"{path}.py::{case.get('name')}"
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        skipped = case.find("skipped")
        if problem is not None:
            out.failed[nodeid] = (problem.get("message") or "")[:300]
        elif skipped is not None and skipped.get("type") == "pytest.xfail":
            out.xfailed[nodeid] = skipped.get("message") or ""
        elif skipped is not None:
            out.skipped[nodeid] = skipped.get("message") or ""
        else:
            out.passed.append(nodeid)
    return out


def test_the_workspace_tests_pass_as_a_docker_group_user(
    runner: tuple[HostUser, Path],
) -> None:
    user, checkout = runner
    top = user.home / "ws-tests"
    junit = top / "junit.xml"
    env = {
        **user.env,
        "PATH": f"{top / 'venv' / 'bin'}:{user.env['PATH']}",
        "PYTHONPATH": str(checkout),
        "CI": "1",
    }
    inner = HostUser(**{**vars(user), "env": env})
    argv = [
        str(top / "venv" / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider",
        "--basetemp", str(top / "pt"), "--junitxml", str(junit), "-q", "-k", "not runsc",
        *WORKSPACE_TESTS,
    ]  # fmt: skip
    started = time.monotonic()
    done = inner.run(*argv, cwd=checkout, timeout=780)
    wall = time.monotonic() - started
    tail = (done.stdout + done.stderr)[-6000:]
    assert junit.is_file(), tail
    out = _outcome(junit)
    print(
        f"\nnon-root run as {user.name} (uid {user.uid}): {len(out.passed)} passed, "
        f"{len(out.failed)} failed, {len(out.skipped)} skipped (root-only), "
        f"{len(out.xfailed)} xfailed (open bugs), {wall:.0f} s wall ({out.seconds:.0f} s in pytest)"
    )
    for nodeid, why in sorted({**out.skipped, **out.xfailed}.items()):
        print(f"  {nodeid}: {why}")
    assert out.failed == {}, tail
    assert done.returncode == 0, tail
    assert len(out.passed) >= FLOOR, (len(out.passed), tail)
    assert {n: w for n, w in out.skipped.items() if not w.startswith(ROOT_ONLY)} == {}
    assert set(out.xfailed) <= OPEN_BUGS, out.xfailed
