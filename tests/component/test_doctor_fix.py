"""``sandvisor doctor`` names what is missing and the one command that fixes it (fake engine)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.engine.fake import FakeEngine
from supervisor.tooling.doctor import one_fix, run_checks
from tests.fake_dockerd import FakeDockerd

pytestmark = [pytest.mark.component, pytest.mark.timeout(30)]


async def test_one_missing_image_names_its_build_command(tmp_path: Path) -> None:
    async with FakeEngine(images={"sandvisor/minimal:latest", "sandvisor/debian:latest"}) as fake:
        report = await run_checks(fake.backend(), state_dir=tmp_path, probe=False)
    dev = report.get("image dev")
    assert dev is not None and dev.status == "fail"
    assert "sandvisor/dev:latest is missing" in dev.detail
    assert dev.fix == "sandvisor images build dev"
    assert not report.ready and one_fix(report) == "sandvisor images build dev"


async def test_several_missing_images_are_one_build(tmp_path: Path) -> None:
    async with FakeEngine(images=set()) as fake:
        report = await run_checks(fake.backend(), state_dir=tmp_path, probe=False)
    assert [c.fix for c in report.failures()] == [
        "sandvisor images build minimal",
        "sandvisor images build debian",
        "sandvisor images build dev",
    ]
    assert one_fix(report) == "sandvisor images build"


async def test_a_ready_host_loads_the_shipped_policies(tmp_path: Path) -> None:
    async with FakeEngine() as fake:
        report = await run_checks(fake.backend(), state_dir=tmp_path, probe=False)
    assert report.ready and report.failures() == []
    policies = report.get("policies")
    assert policies is not None and "dev" in policies.detail and "untrusted" in policies.detail


class Engine2010:
    """The fake backend, saying it is Debian 12's Docker 20.10."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def ping(self) -> dict[str, str]:
        return {**await self.inner.ping(), "version": "20.10.24+dfsg1"}


@pytest.fixture
def engine_sh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeDockerd]:
    """A dockerd of engine.sh's (a fake one, its pid file in a temp run dir) at DOCKER_HOST."""
    fake = FakeDockerd(tmp_path / "engine")
    fake.start()
    monkeypatch.setenv("DOCKER_HOST", fake.docker_host)
    monkeypatch.setenv("SANDVISOR_ENGINE_RUN_DIR", str(fake.run_dir))
    yield fake
    fake.close()


async def test_docker_20_10_names_its_deadlocks_and_what_make_engine_does(
    tmp_path: Path, engine_sh: FakeDockerd
) -> None:
    async with FakeEngine() as fake:
        report = await run_checks(Engine2010(fake.backend()), state_dir=tmp_path, probe=False)
    engine = report.get("engine")
    assert engine is not None and engine.status == "warn" and report.ready
    assert engine.facts["known_deadlocks"] is True
    assert "known libnetwork deadlocks exist in this engine" in engine.detail
    assert "`make engine` installs Debian 13's docker.io 26.1 when it starts an engine" in (
        engine.detail
    )
    assert "SANDVISOR_KEEP_ENGINE=1 keeps 20.10" in engine.detail
    # engine.sh started it: `make engine` upgrades it once its own engine is stopped.
    assert engine.fix == "make engine-down && make engine"
    assert one_fix(report) == "make engine-down && make engine"


async def test_docker_20_10_of_someone_else_has_no_make_engine_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SANDVISOR_ENGINE_RUN_DIR", str(tmp_path / "no-run-dir"))
    async with FakeEngine() as fake:
        report = await run_checks(Engine2010(fake.backend()), state_dir=tmp_path, probe=False)
    engine = report.get("engine")
    assert engine is not None and engine.status == "warn" and engine.fix is None


async def test_a_silent_engine_of_engine_sh_names_fix_engine(
    tmp_path: Path, engine_sh: FakeDockerd
) -> None:
    async with FakeEngine() as fake:
        fake.go_down()
        report = await run_checks(fake.backend(), state_dir=tmp_path, probe=False)
    engine = report.get("engine")
    assert engine is not None and engine.status == "fail"
    sudo = "" if os.geteuid() == 0 else "sudo "
    assert one_fix(report) == f"{sudo}sandvisor doctor --fix-engine"
    assert engine_sh.state() in ("S", "R")  # a check only looks
