"""Whose engine is it (supervisor/tooling/engine_owner.py): only the dockerd engine.sh
started, named by its pid file in the run dir, is ours. Real processes, a temp run dir;
engine.sh's own ``our_pid`` (``scripts/engine.sh started-by-us``) decides the same way."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.tooling.engine_owner import cmdline, identify, socket_path, started_pid
from tests.conftest import REPO
from tests.fake_dockerd import FakeDockerd, wait_for

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def spawn() -> Iterator[Callable[..., int]]:
    """Start a process (argv); all are killed and reaped after the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*argv: str) -> int:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        procs.append(proc)
        # Until the new program shows its command line (under load, a read right after
        # the fork can find it empty).
        deadline = time.monotonic() + 10
        while not cmdline(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def script_says_ours(run_dir: Path) -> bool:
    """engine.sh's verdict: ``started-by-us`` exits 0 for the dockerd it started."""
    done = subprocess.run(
        [str(REPO / "scripts" / "engine.sh"), "started-by-us"],
        env={**os.environ, "SANDVISOR_ENGINE_RUN_DIR": str(run_dir)},
        capture_output=True,
        timeout=10,
        check=False,
    )
    return done.returncode == 0


def write_pid(run_dir: Path, pid: int | str) -> None:
    (run_dir / "dockerd.pid").write_text(f"{pid}\n")


def reaped_pid() -> int:
    """The pid of a process that has exited and been reaped (a stale pid)."""
    proc = subprocess.Popen(["true"])
    proc.wait(timeout=10)
    return proc.pid


def test_a_missing_pid_file_is_not_ours(run_dir: Path) -> None:
    pid, why = started_pid(run_dir)
    assert pid is None and f"there is no pid file {run_dir}/dockerd.pid" in why
    assert not script_says_ours(run_dir)
    verdict = identify(f"unix://{run_dir}/none.sock", run_dir)
    assert verdict.kind == "not_ours"
    assert "was not started by scripts/engine.sh" in verdict.why
    assert "nothing listens at" in verdict.todo and "make engine" in verdict.todo


def test_a_stale_pid_is_not_ours(run_dir: Path) -> None:
    stale = reaped_pid()
    write_pid(run_dir, stale)
    pid, why = started_pid(run_dir)
    assert pid is None and f"names pid {stale}, which is not running" in why
    assert not script_says_ours(run_dir)


def test_a_pid_file_without_a_pid_is_not_ours(run_dir: Path) -> None:
    write_pid(run_dir, "-1; rm -rf /")
    pid, why = started_pid(run_dir)
    assert pid is None and "does not hold a pid" in why
    assert not script_says_ours(run_dir)


@pytest.mark.parametrize(
    "argv",
    [
        ("sleep", "60"),
        # "dockerd" in the command line, but the program is bash (or tail): not dockerd.
        ("bash", "-c", "sleep 60; : dockerd"),
        ("tail", "-f", "/dev/null", "/tmp/sandvisor-dockerd.log"),
    ],
    ids=["sleep", "bash-mentions-dockerd", "tail-of-its-log"],
)
def test_a_pid_file_naming_another_program_is_not_ours(
    run_dir: Path, spawn: Callable[..., int], argv: tuple[str, ...]
) -> None:
    other = spawn(*argv)
    write_pid(run_dir, other)
    pid, why = started_pid(run_dir)
    assert pid is None and f"names pid {other}, which is `{argv[0]}" in why
    assert why.endswith("not dockerd")
    assert not script_says_ours(run_dir)
    assert os.path.exists(f"/proc/{other}")  # looked at, not touched


def test_a_dockerd_is_ours_for_engine_sh_too(run_dir: Path, spawn: Callable[..., int]) -> None:
    # bash's `exec -a` names the program dockerd (the first field of its command line).
    pid = spawn("bash", "-c", "exec -a /usr/sbin/dockerd sleep 60")
    write_pid(run_dir, pid)
    wait_for(
        lambda: Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"/usr/sbin/dockerd\0"),
        5,
        "bash exec'ing",
    )
    assert started_pid(run_dir) == (pid, "")
    assert script_says_ours(run_dir)


def test_the_dockerd_that_serves_the_socket_is_ours(tmp_path: Path) -> None:
    fake = FakeDockerd(tmp_path)
    fake.start()
    try:
        verdict = identify(fake.docker_host, fake.run_dir)
        assert verdict.ours, verdict
        assert verdict.pid == fake.pid and verdict.socket == str(fake.socket)
        # The same socket spelled through a symlinked folder is the same engine.
        (tmp_path / "alias").symlink_to(tmp_path)
        assert identify(f"unix://{tmp_path}/alias/docker.sock", fake.run_dir).ours
    finally:
        fake.close()


def test_a_dockerd_of_engine_sh_that_does_not_serve_docker_host_is_not_ours(
    tmp_path: Path,
) -> None:
    """DOCKER_HOST names another engine: engine.sh's dockerd (running fine) is not it."""
    ours = FakeDockerd(tmp_path / "ours")
    elsewhere = FakeDockerd(tmp_path / "elsewhere")
    ours.start()
    elsewhere.start()
    try:
        verdict = identify(elsewhere.docker_host, ours.run_dir)
        assert verdict.kind == "not_ours" and verdict.pid == ours.pid
        assert f"(pid {ours.pid}, which does not listen at" in verdict.why
        assert f"it is pid {elsewhere.pid} (`" in verdict.todo
        assert "restart it the way it was started" in verdict.todo
        # Nothing at all listens there: engine.sh's own way to restart it.
        lonely = identify(f"unix://{tmp_path}/nothing.sock", ours.run_dir)
        assert lonely.kind == "not_ours"
        assert "make engine-down && make engine" in lonely.todo
    finally:
        ours.close()
        elsewhere.close()


def test_a_tcp_docker_host_is_never_ours(run_dir: Path) -> None:
    verdict = identify("tcp://10.0.0.7:2375", run_dir)
    assert verdict.kind == "not_ours" and "is not a socket on this host" in verdict.why
    assert "unset DOCKER_HOST" in verdict.todo


def test_socket_paths() -> None:
    assert socket_path("unix:///var/run/docker.sock") == "/var/run/docker.sock"
    assert socket_path("unix://") == "/var/run/docker.sock"
    assert socket_path("tcp://127.0.0.1:2375") is None
    assert socket_path("ssh://me@host") is None
