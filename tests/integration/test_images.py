"""The sandbox images against the real engine: offline builds, idempotence, hardened runs."""

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

from supervisor.tooling import images

# The first test builds what `make images` did not: sandvisor/dev alone takes 2 to 6 minutes
# on a loaded 2-core machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

SANDVISOR = str(Path(sys.executable).with_name("sandvisor"))


def _client_or_fail() -> Any:
    try:
        return images.connect(timeout=30)
    except Exception as exc:
        message = f"the Docker engine does not answer ({exc}); run `make engine`"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    api = _client_or_fail()
    yield api
    api.close()


@pytest.fixture(scope="module")
def first_builds(client: Any) -> dict[str, images.BuildResult]:
    """Every catalogue image, built (or found up to date) once for the module."""
    return {r.name: r for r in images.ensure_built(client=client)}


def run_hardened(image: str, command: list[str]) -> tuple[int, str]:
    """Run like the default policy does: no network, read-only root, uid 65534."""
    api = docker.from_env(version="auto")
    container = None
    try:
        container = api.containers.run(
            image,
            command,
            detach=True,
            network_mode="none",
            read_only=True,
            user="65534:65534",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            labels={"io.sandvisor.test": "1"},
        )
        code = container.wait(timeout=60)["StatusCode"]
        return code, container.logs(stdout=True, stderr=True).decode()
    finally:
        if container is not None:
            container.remove(force=True)
        api.close()


@pytest.mark.parametrize("name", images.IMAGES)
def test_build_produces_labeled_tags(
    client: Any, first_builds: dict[str, images.BuildResult], name: str
) -> None:
    result = first_builds[name]
    source_hash = images.source_hash(name)
    assert result.tag == f"sandvisor/{name}:{source_hash}"
    tagged = client.inspect_image(result.tag)
    latest = client.inspect_image(f"sandvisor/{name}:latest")
    assert tagged["Id"] == latest["Id"] == result.image_id
    labels = latest["Config"]["Labels"]
    assert labels[images.LABEL_IMAGE] == name
    assert labels[images.LABEL_SOURCE_HASH] == source_hash


@pytest.mark.parametrize("name", images.IMAGES)
def test_second_build_is_skipped(
    client: Any, first_builds: dict[str, images.BuildResult], name: str
) -> None:
    again = images.build(name, client=client)
    assert again.built is False
    assert again.method == "cached"
    assert again.image_id == first_builds[name].image_id
    assert again.seconds < 5
    assert client.inspect_image(f"sandvisor/{name}:latest")["Id"] == first_builds[name].image_id


def test_latest_is_repointed_without_a_rebuild(
    client: Any, first_builds: dict[str, images.BuildResult]
) -> None:
    """If ``latest`` went missing but the hash tag exists, build only re-tags."""
    result = first_builds["minimal"]
    client.remove_image("sandvisor/minimal:latest")
    try:
        again = images.build("minimal", client=client)
        assert (again.built, again.image_id) == (False, result.image_id)
    finally:
        client.tag(result.image_id, "sandvisor/minimal", "latest", force=True)
    assert client.inspect_image("sandvisor/minimal:latest")["Id"] == result.image_id


@pytest.mark.parametrize("name", images.IMAGES)
def test_status_reports_up_to_date(
    client: Any, first_builds: dict[str, images.BuildResult], name: str
) -> None:
    status = images.image_status(client, name)
    assert status.present and status.up_to_date and status.state == "yes"
    assert status.image_id == first_builds[name].image_id
    assert status.size_bytes and status.size_bytes > 0
    assert status.created is not None


def test_minimal_runs_hardened(first_builds: dict[str, images.BuildResult]) -> None:
    assert run_hardened("sandvisor/minimal:latest", ["sh", "-c", "echo hi"]) == (0, "hi\n")
    code, out = run_hardened("sandvisor/minimal:latest", ["sh", "-c", "id -u; whoami"])
    assert (code, out) == (0, "65534\nnobody\n")


def test_debian_runs_python_and_git_hardened(first_builds: dict[str, images.BuildResult]) -> None:
    assert run_hardened("sandvisor/debian:latest", ["python3", "-c", "print(1)"]) == (0, "1\n")
    code, out = run_hardened("sandvisor/debian:latest", ["git", "--version"])
    assert code == 0
    assert out.startswith("git version ")
    code, out = run_hardened("sandvisor/debian:latest", ["bash", "-c", "whoami; ps -o user= -p 1"])
    assert (code, out.split()) == (0, ["nobody", "nobody"])


#: What sandvisor/dev must run as uid 65534 on a read-only root with HOME=/tmp. Each line prints
#: a marker, then the tool's first line of output, so a missing tool shows which one.
DEV_TOOLS = """\
set -e
echo "pytest: $(python3 -m pytest --version 2>&1 | head -n1)"
python3 -m venv /tmp/v
echo "venv pip: $(/tmp/v/bin/pip --version)"
echo "node: $(node -e 'console.log(1 + 1)')"
echo "npm: $(npm --version)"
printf 'int main(void) { return 42; }\\n' > /tmp/t.c
gcc -o /tmp/t /tmp/t.c && { /tmp/t || echo "gcc: built, ran, exit $?"; }
echo "gcc: $(gcc --version | head -n1)"
echo "make: $(make --version | head -n1)"
echo "git: $(git --version)"
echo "curl: $(curl --version | head -n1)"
echo "python: $(python3 -c 'import sys; print(*sys.version_info[:2], sep=".")')"
echo "whoami: $(id -u) $HOME"
"""


def test_dev_has_its_toolchains_hardened(first_builds: dict[str, images.BuildResult]) -> None:
    """One container as the default policy runs tasks: read-only root, uid 65534, tmpfs /tmp
    (exec, as the policies mount it), HOME=/tmp, Docker's init as PID 1, no network."""
    api = docker.from_env(version="auto")
    container = None
    try:
        container = api.containers.run(
            "sandvisor/dev:latest",
            ["bash", "-c", DEV_TOOLS],
            detach=True,
            network_mode="none",
            read_only=True,
            user="65534:65534",
            cap_drop=["ALL"],
            security_opt=["no-new-privileges:true"],
            tmpfs={"/tmp": "rw,exec,nosuid,nodev,size=256m,uid=65534,gid=65534"},
            environment={"HOME": "/tmp"},
            init=True,
            labels={"io.sandvisor.test": "1"},
        )
        code = container.wait(timeout=120)["StatusCode"]
        out = container.logs(stdout=True, stderr=True).decode()
    finally:
        if container is not None:
            container.remove(force=True)
        api.close()
    assert code == 0, out
    lines = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
    assert lines["pytest"].startswith("pytest "), out
    assert lines["venv pip"].startswith("pip ") and "/tmp/v/lib/python3" in lines["venv pip"]
    assert lines["node"] == "2"
    assert lines["npm"][0].isdigit(), out
    assert "gcc: built, ran, exit 42" in out
    assert lines["gcc"].startswith("gcc (Debian")
    assert lines["make"].startswith("GNU Make ")
    assert lines["git"].startswith("git version ")
    assert lines["curl"].startswith("curl ")
    # A host venv made with a Debian 12 python3 only runs inside on the same minor version.
    assert lines["python"] == "3.11"
    assert lines["whoami"] == "65534 /tmp"


def test_cli_build_and_list(first_builds: dict[str, images.BuildResult]) -> None:
    done = subprocess.run(
        [SANDVISOR, "images", "build"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "up to date: sandvisor/minimal:" in done.stdout
    assert "up to date: sandvisor/debian:" in done.stdout
    assert "up to date: sandvisor/dev:" in done.stdout
    assert "\r" not in done.stdout
    listed = subprocess.run(
        [SANDVISOR, "images", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    for name, result in first_builds.items():
        assert rows[name]["state"] == "yes"
        assert rows[name]["image_id"] == result.image_id
    table = subprocess.run(
        [SANDVISOR, "images", "list"], capture_output=True, text=True, timeout=60, check=False
    )
    lines = [line.split("\t") for line in table.stdout.splitlines()]
    assert [(cells[0], cells[-1]) for cells in lines] == [(n, "yes") for n in images.IMAGES]


def test_cli_rejects_unknown_names() -> None:
    done = subprocess.run(
        [SANDVISOR, "images", "build", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown image nope" in done.stderr


def test_cli_without_engine_fails_cleanly() -> None:
    env = {**os.environ, "DOCKER_HOST": "unix:///tmp/nonexistent.sock"}
    for argv in (["images", "build"], ["images", "list"]):
        done = subprocess.run(
            [SANDVISOR, *argv], capture_output=True, text=True, timeout=60, check=False, env=env
        )
        assert done.returncode == 1
        assert "nonexistent.sock" in done.stderr
        assert "Traceback" not in done.stderr + done.stdout
