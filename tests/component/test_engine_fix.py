"""``doctor --fix-engine`` (supervisor/tooling/engine_fix.py) on a fake dockerd
(tests/fake_dockerd.py): a wedged engine.sh engine is stopped and started again with its
own command line; anything else is refused and left exactly as it was. No Docker."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.tooling.engine_fix import fix_engine, look
from supervisor.tooling.engine_owner import cmdline
from tests.fake_dockerd import VERSION, FakeDockerd

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeDockerd]:
    engine = FakeDockerd(tmp_path)
    engine.start()
    yield engine
    engine.close()


async def test_a_wedged_engine_of_engine_sh_is_restarted_with_its_command_line(
    fake: FakeDockerd,
) -> None:
    argv = cmdline(fake.pid)
    old = fake.pid
    assert (await look(fake.docker_host)).state == "up"
    fake.freeze()
    wedged = await look(fake.docker_host)
    assert wedged.state == "wedged" and "a ping was taken but not answered" in wedged.why

    done = await fix_engine(fake.docker_host, fake.run_dir, euid=0, start_s=20)

    assert done.action == "restarted", done
    assert (done.state_before, done.state_after, done.version) == ("wedged", "up", VERSION)
    assert done.old_pid == old and done.new_pid not in (None, old)
    assert done.new_pid is not None
    assert cmdline(done.new_pid) == argv  # the same engine, started again
    assert fake.pidfile_pid() == done.new_pid  # still engine.sh's to stop
    assert fake.state(old) in ("", "Z")  # the old one is gone
    assert f"restarted dockerd (pid {old} -> {done.new_pid})" in done.message
    assert "was wedged" in done.message and f"Docker {VERSION}" in done.message
    assert done.log == str(fake.log)
    assert fake.log.read_text().count("listening on") == 2  # the same log, appended
    assert (await look(fake.docker_host)).state == "up"


async def test_an_engine_that_ignores_sigterm_is_killed_then_started(tmp_path: Path) -> None:
    fake = FakeDockerd(tmp_path, extra=("--ignore-term",))
    fake.start()
    try:
        fake.freeze()
        # Killed, it leaves its pid file behind, naming a zombie (our child, not reaped):
        # the restart removes it, or the new one would refuse to start, as dockerd does.
        done = await fix_engine(fake.docker_host, fake.run_dir, euid=0, stop_s=0.5, start_s=20)
        assert done.action == "restarted", done
        assert done.state_after == "up"
    finally:
        fake.close()


async def test_an_engine_that_is_up_is_left_alone(fake: FakeDockerd) -> None:
    done = await fix_engine(fake.docker_host, fake.run_dir, euid=0)
    assert (done.action, done.state_before, done.version) == ("none", "up", VERSION)
    assert "nothing to restart" in done.message
    assert fake.state() in ("S", "R") and fake.pidfile_pid() == fake.pid


async def test_an_engine_not_named_by_the_pid_file_is_refused_untouched(
    fake: FakeDockerd,
) -> None:
    """The pid file names another program: the wedged engine stays as it is, frozen."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        fake.pidfile.write_text(str(other.pid))
        fake.freeze()
        done = await fix_engine(fake.docker_host, fake.run_dir, euid=0, start_s=5)
        assert done.action == "refused", done
        assert done.state_before == "wedged" and done.state_after is None
        assert f"names pid {other.pid}, which is `sleep 60`, not dockerd" in done.message
        assert f"it is pid {fake.pid}" in done.todo
        assert fake.state() == "T"  # still stopped: never signalled
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


async def test_no_pid_file_is_refused_untouched(fake: FakeDockerd) -> None:
    fake.pidfile.unlink()
    fake.freeze()
    done = await fix_engine(fake.docker_host, fake.run_dir, euid=0, start_s=5)
    assert done.action == "refused"
    assert "was not started by scripts/engine.sh: there is no pid file" in done.message
    assert fake.state() == "T"


async def test_without_root_nothing_is_signalled(fake: FakeDockerd) -> None:
    fake.freeze()
    done = await fix_engine(fake.docker_host, fake.run_dir, euid=1000, start_s=5)
    assert done.action == "refused"
    assert f"restarting dockerd pid {fake.pid}" in done.message and "needs root" in done.message
    assert done.todo == "run it as root: `sudo sandvisor doctor --fix-engine`"
    assert fake.state() == "T"


async def test_a_down_engine_with_a_stale_pid_file_names_make_engine(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait(timeout=10)
    (run_dir / "dockerd.pid").write_text(str(gone.pid))
    done = await fix_engine(f"unix://{tmp_path}/docker.sock", run_dir, euid=0)
    assert (done.action, done.state_before) == ("refused", "down")
    assert f"names pid {gone.pid}, which is not running" in done.message
    assert "make engine" in done.todo


async def test_a_restart_that_does_not_come_back_says_why(tmp_path: Path) -> None:
    marker = tmp_path / "fail-next"
    fake = FakeDockerd(tmp_path, extra=("--exit-if", str(marker)))
    fake.start()
    try:
        marker.touch()  # the one started again exits at once
        fake.freeze()
        done = await fix_engine(fake.docker_host, fake.run_dir, euid=0, start_s=20)
        assert done.action == "failed", done
        assert "exited with 3" in done.message and "told to fail" in done.message
        assert str(fake.log) in done.todo
        assert done.state_after == "down"
    finally:
        fake.close()


async def test_plain_doctor_on_an_engine_that_answers_404_reports_instead_of_crashing(
    fake: FakeDockerd, tmp_path: Path
) -> None:
    """An engine that answers 404 to what doctor asks (the stand-in knows three paths) gets
    a report with failed checks, never a traceback of the backend's internal not-found."""
    from supervisor.engine.docker.backend import DockerBackend  # noqa: PLC0415
    from supervisor.tooling.doctor import run_checks  # noqa: PLC0415

    backend = DockerBackend(fake.docker_host)
    try:
        report = await run_checks(backend, state_dir=tmp_path / "state", probe=False)
    finally:
        await backend.aclose()
    failed = [c for c in report.checks if c.status == "fail"]
    assert failed, report
    assert any("404" in c.detail or "not found" in c.detail.lower() for c in failed), report
