"""``sandvisor doctor`` names what is missing and the one command that fixes it (fake engine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.engine.fake import FakeEngine
from supervisor.tooling.doctor import one_fix, run_checks

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
