"""Adversarial suite fixtures: every case runs once on runc and once on gVisor (runsc),
and the run ends with one summary line."""

from __future__ import annotations

import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from supervisor import Supervisor
from tests.conftest import POLICIES, require_engine

pytest.register_assert_rewrite("tests.adversarial.harness")
from tests.adversarial.harness import Arena, owned_by  # noqa: E402 - after the rewrite registration

RUNTIMES = ("runc", "runsc")


def _ws_policy(runtime: str, host_path: Path) -> str:
    """The shipped policy of ``runtime`` (same limits) plus a read-write host workspace, for
    cases that need a place on the host the sandbox can write to."""
    base = "default" if runtime == "runc" else "untrusted"
    text = (POLICIES / f"{base}.toml").read_text()
    text = re.sub(r"(?m)^description = .*$", f'description = "tests: {base} + rw workspace"', text)
    return (
        text
        + f'\n[workspace]\nhost_path = "{host_path}"\ncontainer_path = "/hostws"\nmode = "rw"\n'
    )


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def arena(
    runtime: str,
    tmp_path: Path,
    state_dir: Path,
    policies_dir: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Arena]:
    require_engine()
    roots = tmp_path / "roots"
    workspace = roots / "ws"
    workspace.mkdir(parents=True)
    workspace.chmod(0o777)
    for rt in RUNTIMES:
        (policies_dir / f"adv-ws-{rt}.toml").write_text(_ws_policy(rt, workspace))
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[roots]
    ) as sup:
        a = Arena(runtime, sup, tmp_path, workspace, node=request.node)
        await a.open(request.node.name.split("[")[0].removeprefix("test_")[:40].replace("_", "-"))
        yield a
        if not a.finished:
            # The case failed before finish(): still end the session so nothing is left.
            await a.session.end()
            if a.watch is not None:
                a.watch.close()
    # Closing the supervisor removes its warm pools too: nothing of it is left at all.
    assert owned_by(sup.instance_id) == [], "containers left behind after close"


@pytest.fixture
def project_root(tmp_path: Path) -> Path:
    """The workspace root of ``ws_arena``'s supervisor (the project goes in it)."""
    path = tmp_path / "wsroots"
    path.mkdir()
    return path


@pytest.fixture
def small_state(state_dir: Path) -> Iterator[Path]:
    """The state dir on a 64 MiB tmpfs, where the overlay's upper lives: a case can fill
    it without touching the host's disk. Ask for it before ``ws_arena``."""
    state_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(state_dir)], check=True)
    try:
        yield state_dir
    finally:
        subprocess.run(["umount", "-l", str(state_dir)], check=False)


@pytest.fixture
async def ws_arena(
    runtime: str,
    tmp_path: Path,
    state_dir: Path,
    policies_dir: Path,
    project_root: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[Arena]:
    """An arena whose session the case opens on a project: ``await
    ws_arena.open_workspace(name, project, mode)``."""
    require_engine()
    async with Supervisor(
        state_dir=state_dir, policies_dir=policies_dir, workspace_roots=[project_root]
    ) as sup:
        a = Arena(runtime, sup, tmp_path, project_root, node=request.node)
        yield a
        if a.session is not None and not a.finished:
            await a.session.end()
            if a.watch is not None:
                a.watch.close()
    assert owned_by(sup.instance_id) == [], "containers left behind after close"


_PARAM = re.compile(r"\[(runc|runsc)\]$")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """``adversarial: N cases on runc, M cases on runsc, passed X, failed Y``."""
    outcome: dict[str, str] = {}
    for key in ("passed", "failed", "error"):
        for report in terminalreporter.stats.get(key, []):
            nodeid = getattr(report, "nodeid", "")
            if "tests/adversarial/" not in nodeid or not _PARAM.search(nodeid):
                continue
            if key == "passed" and report.when != "call":
                continue
            if key != "passed" or nodeid not in outcome:
                outcome[nodeid] = "passed" if key == "passed" else "failed"
    if not outcome:
        return
    per_runtime = {rt: sum(1 for n in outcome if n.endswith(f"[{rt}]")) for rt in RUNTIMES}
    passed = sum(1 for v in outcome.values() if v == "passed")
    failed = len(outcome) - passed
    terminalreporter.write_line(
        f"adversarial: {per_runtime['runc']} cases on runc, {per_runtime['runsc']} cases on "
        f"runsc, passed {passed}, failed {failed}"
    )
    # What a runtime did differently (e.g. gVisor's sandbox dying on a fork bomb).
    notes = set()
    for key in ("passed", "failed"):
        for report in terminalreporter.stats.get(key, []):
            if report.when != "call" or "tests/adversarial/" not in report.nodeid:
                continue
            for name, value in report.user_properties:
                if name == "note":
                    notes.add(f"  {report.nodeid.split('::')[-1]}: {value}")
    for line in sorted(notes):
        terminalreporter.write_line(line)
