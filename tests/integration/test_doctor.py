"""``sandvisor doctor`` against the real engine, and against an engine that does not answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from supervisor.engine.docker import DockerBackend
from supervisor.tooling import images
from supervisor.tooling.doctor import run_checks

# The first test builds the images `make images` did not (sandvisor/dev: 2 to 6 minutes).
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

SANDVISOR = str(Path(sys.executable).with_name("sandvisor"))
DEAD_HOST = "unix:///tmp/nonexistent.sock"


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    try:
        api = images.connect(timeout=30)
    except Exception as exc:
        message = f"the Docker engine does not answer ({exc}); run `make engine`"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    images.ensure_built(client=api)
    yield api
    api.close()


def sandvisor(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SANDVISOR, *argv],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, **(env or {})},
    )


def runsc_really_starts(client: Any) -> bool:
    """Ground truth for the runsc check: start a container under gVisor ourselves."""
    if "runsc" not in client.info().get("Runtimes", {}):
        return False
    api = docker.from_env(version="auto")
    container = None
    try:
        container = api.containers.create(
            "sandvisor/minimal:latest",
            ["true"],
            runtime="runsc",
            network_mode="none",
            user="65534:65534",
            labels={"io.sandvisor.test": "1"},
        )
        container.start()
        return int(container.wait(timeout=60)["StatusCode"]) == 0
    except docker.errors.DockerException:
        return False
    finally:
        if container is not None:
            container.remove(force=True)
        api.close()


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in report["checks"]}


def engine_status(client: Any) -> str:
    """What the engine check says of this engine: a warning for 20.10 (known deadlocks)."""
    return "warn" if str(client.version()["Version"]).startswith("20.10.") else "ok"


def test_doctor_json_tells_the_truth(client: Any, tmp_path: Path) -> None:
    state = tmp_path / "state"
    done = sandvisor("doctor", "--json", "--state-dir", str(state))
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    checks = by_name(report)
    assert list(checks) == [
        "engine",
        "runtime runc",
        "runtime runsc",
        "image minimal",
        "image debian",
        "image dev",
        "state dir",
        "policies",
    ]

    version = client.version()
    engine = checks["engine"]
    assert engine["facts"]["version"] == version["Version"]
    assert engine["facts"]["api_version"] == version["ApiVersion"]
    assert engine["detail"].startswith(f"Docker {version['Version']} (API {version['ApiVersion']})")
    if version["Version"].startswith("20.10."):
        # Debian 12's docker.io: it works, with the deadlocks of issue 29 named.
        assert engine["status"] == "warn"
        assert engine["facts"]["known_deadlocks"] is True
        assert "moby #46661, #44682" in engine["detail"]
        assert "newer engines fix them" in engine["detail"]
    else:
        assert engine["status"] == "ok"
        assert "known_deadlocks" not in engine["facts"]

    registered = set(client.info()["Runtimes"])
    runc = checks["runtime runc"]
    assert (runc["status"], runc["facts"]["registered"], runc["facts"]["starts"]) == (
        "ok",
        True,
        True,
    )
    runsc = checks["runtime runsc"]
    assert runsc["facts"]["registered"] == ("runsc" in registered)
    if runsc_really_starts(client):
        assert runsc["status"] == "ok"
        assert runsc["facts"]["starts"] is True
    else:
        assert runsc["status"] == "warn"
        assert runsc["facts"]["starts"] is not True

    for name in images.IMAGES:
        check = checks[f"image {name}"]
        status = images.image_status(client, name)
        assert check["facts"]["image_id"] == client.inspect_image(f"sandvisor/{name}:latest")["Id"]
        assert check["facts"]["up_to_date"] == status.up_to_date
        assert check["facts"]["source_hash"] == status.source_hash
        assert check["status"] == ("ok" if status.up_to_date else "warn")

    assert checks["state dir"]["status"] == "ok"
    assert checks["state dir"]["facts"]["created"] is True
    assert state.is_dir()
    assert list(state.iterdir()) == []

    assert report["ready"] is True
    assert done.returncode == 0, done.stderr


def test_doctor_table_when_piped(client: Any, tmp_path: Path) -> None:
    done = sandvisor("doctor", "--no-probe", "--state-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert rows[0][:2] == ["engine", engine_status(client)]
    assert all(len(row) == 3 for row in rows)
    assert ["runtime runc", "ok", "registered (not probed)"] in rows


def test_unwritable_state_dir_fails(client: Any, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    done = sandvisor("doctor", "--json", "--no-probe", "--state-dir", str(blocker / "state"))
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert report["ready"] is False
    assert by_name(report)["state dir"]["status"] == "fail"
    assert "state dir" in done.stderr
    assert "Traceback" not in done.stderr


def test_dead_engine_exits_1_with_a_clear_message(tmp_path: Path) -> None:
    done = sandvisor("doctor", "--state-dir", str(tmp_path), env={"DOCKER_HOST": DEAD_HOST})
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    errors = done.stderr.strip().splitlines()
    assert errors[-1].startswith(
        "sandvisor: error: not ready: engine: no Docker engine answers at "
    )
    assert DEAD_HOST in errors[-1]
    assert done.stdout.splitlines()[0].startswith("engine\tfail\t")


def test_dead_engine_json(tmp_path: Path) -> None:
    done = sandvisor(
        "doctor", "--json", "--state-dir", str(tmp_path), env={"DOCKER_HOST": DEAD_HOST}
    )
    assert done.returncode == 1
    report = json.loads(done.stdout)
    checks = by_name(report)
    assert report["ready"] is False
    assert checks["engine"]["status"] == "fail"
    assert checks["engine"]["facts"] == {
        "host": DEAD_HOST,
        "reachable": False,
        "error": checks["engine"]["facts"]["error"],
    }
    assert checks["runtime runc"]["status"] == "fail"
    assert checks["runtime runsc"]["status"] == "warn"
    assert checks["state dir"]["status"] == "ok"


async def test_run_checks_as_a_library(client: Any, tmp_path: Path) -> None:
    backend = DockerBackend()
    try:
        report = await run_checks(backend, state_dir=tmp_path, probe=False)
    finally:
        await backend.aclose()
    assert report.ready
    engine = report.get("engine")
    assert engine is not None
    assert engine.status == engine_status(client)
    assert report.failures() == []
