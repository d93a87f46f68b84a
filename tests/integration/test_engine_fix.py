"""``sandvisor doctor --fix-engine`` on a real dockerd (issue 29): a private engine whose pid
file is the run dir's ``dockerd.pid`` (as scripts/engine.sh starts one) is SIGSTOPped, and
doctor restarts it with its own command line; an engine engine.sh did not start is refused
and left exactly as it was. Never the shared engine: DOCKER_HOST and
SANDVISOR_ENGINE_RUN_DIR always name the private engines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.tooling.engine_owner import cmdline
from tests.private_engine import EngineConfig, PrivateEngine

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SANDVISOR = str(Path(sys.executable).with_name("sandvisor"))


def doctor_fix(
    engine: PrivateEngine, run_dir: Path, state: Path
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DOCKER_HOST": engine.docker_host,
        "SANDVISOR_ENGINE_RUN_DIR": str(run_dir),
        "SANDVISOR_ENGINE_WAIT_S": "60",
    }
    return subprocess.run(
        [SANDVISOR, "doctor", "--fix-engine", "--json", "--no-probe", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
        env=env,
    )


def process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_wedged_engine_of_engine_sh_is_restarted(
    private_engine: PrivateEngine, tmp_path: Path
) -> None:
    engine = private_engine
    # dockerd writes its --pidfile into the engine's folder: that folder is the run dir.
    run_dir = engine.pidfile.parent
    old = engine.pid
    assert old is not None and engine.pidfile.read_text().strip() == str(old)
    argv = cmdline(old)
    engine.freeze()
    assert process_state(old) == "T" and not engine.ping()

    done = doctor_fix(engine, run_dir, tmp_path / "state")

    assert "Traceback" not in done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    fix = report["engine_fix"]
    assert (fix["action"], fix["state_before"], fix["state_after"]) == (
        "restarted",
        "wedged",
        "up",
    ), done.stderr
    new = int(engine.pidfile.read_text().strip())
    assert fix["old_pid"] == old and fix["new_pid"] == new != old
    engine.adopt(new)
    assert cmdline(new) == argv  # the same engine, started again with its arguments
    assert engine.ping()
    version = engine.client().version()["Version"]
    assert fix["version"] == version
    line = next(x for x in done.stderr.splitlines() if x.startswith("engine: "))
    assert f"restarted dockerd (pid {old} -> {new})" in line
    assert f"it is up, Docker {version}" in line
    # ... and the checks that follow say the engine is up.
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["engine"]["status"] in ("ok", "warn")
    assert checks["engine"]["facts"]["reachable"] is True
    assert checks["engine"]["facts"]["version"] == version
    assert checks["runtime runc"]["status"] == "ok"
    # The private engine has the minimal and debian images, not dev.
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] in ([], ["image dev"])
    assert done.returncode == (0 if report["ready"] else 1)


def test_an_engine_engine_sh_did_not_start_is_refused_untouched(
    private_engine_factory: Callable[[EngineConfig], PrivateEngine], tmp_path: Path
) -> None:
    """Frozen, it stays frozen, with the same pid: first with no pid file at all, then with
    a pid file that names a dockerd of engine.sh's that is another engine (healthy)."""
    wedged = private_engine_factory(EngineConfig(images=()))
    other = private_engine_factory(EngineConfig(images=()))
    assert wedged.pid is not None and other.pid is not None
    wedged.freeze()
    empty = tmp_path / "run"
    empty.mkdir()

    done = doctor_fix(wedged, empty, tmp_path / "state")
    assert done.returncode == 1
    fix = json.loads(done.stdout)["engine_fix"]
    assert (fix["action"], fix["state_before"]) == ("refused", "wedged")
    assert "was not started by scripts/engine.sh: there is no pid file" in fix["message"]
    assert f"it is pid {wedged.pid}" in fix["todo"]
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("sandvisor: error: the engine at ")
    assert "doctor did not restart it" in error and "to fix: " in error
    assert process_state(wedged.pid) == "T"

    # The run dir of `other`: its pid file names a dockerd, but not the one at DOCKER_HOST.
    done = doctor_fix(wedged, other.pidfile.parent, tmp_path / "state")
    assert done.returncode == 1
    fix = json.loads(done.stdout)["engine_fix"]
    assert fix["action"] == "refused"
    assert f"(pid {other.pid}, which does not listen at" in fix["message"]
    assert process_state(wedged.pid) == "T"
    assert other.pidfile.read_text().strip() == str(other.pid) and other.ping()

    wedged.thaw()
    assert wedged.ping() and wedged.pidfile.read_text().strip() == str(wedged.pid)
