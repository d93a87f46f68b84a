"""Shared fixtures: the real engine, the sandbox images, per-test supervisors and policies."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

#: Fixtures of a private Docker engine (for engine-restart and missing-runtime tests).
pytest_plugins = ("tests.private_engine", "tests.engine_watchdog", "tests.parallel")

REPO = Path(__file__).resolve().parent.parent
POLICIES = REPO / "policies"
IN_CI = bool(os.environ.get("CI"))

# Hypothesis: in CI every run tries the same examples (derandomize: a red CI run is a real,
# reproducible failure, not a new random draw), no example database, no wall-clock deadline
# on a shared 2-core runner, and a failure prints the blob to reproduce it with
# ``@reproduce_failure``. Locally the "dev" profile keeps exploring randomly (with the example
# database). Loaded here, before the test modules are imported, so every ``@settings(...)``
# inherits it.
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
# ``make fuzz``: the same properties with fresh random draws and 20 times the examples,
# outside ``make test``; what it finds is kept as an ``@example`` on the property.
settings.register_profile("fuzz", max_examples=2000, deadline=None, print_blob=True)
_PROFILE = os.environ.get("SANDVISOR_HYPOTHESIS_PROFILE") or ("ci" if IN_CI else "dev")
settings.load_profile(_PROFILE)


def examples(n: int) -> int:
    """A property's example budget: ``n``, 20 times that under ``make fuzz``."""
    return n * 20 if _PROFILE == "fuzz" else n


#: Extra policies only the tests use: short grace periods keep stop tests quick.
TEST_POLICIES = {
    "fast": """
description = "tests: minimal image, 1 s grace"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
grace_s = 1.0
[env]
allow = ["*"]
""",
    "tiny": """
description = "tests: 24 MiB of memory"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[limits]
memory_mb = 24
[[tmpfs]]
path = "/tmp"
size_mb = 8
[timeouts]
grace_s = 1.0
""",
    "warm": """
description = "tests: minimal image with a warm pool of 2"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
warm_pool = 2
[timeouts]
grace_s = 1.0
[env]
allow = ["*"]
[session]
max_running_tasks = 4
""",
    "strict": """
description = "tests: short maximum timeout, no persistent tasks"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
default_ms = 1000
max_ms = 1000
allow_persistent = false
""",
    "missingimage": """
description = "tests: an image nobody built"
image = "sandvisor/does-not-exist:latest"
""",
}


def engine_problem() -> str | None:
    """None when the engine answers and the images exist; else what is wrong."""
    try:
        import docker  # noqa: PLC0415

        client = docker.APIClient(version="auto", timeout=10)
        client.ping()
    except Exception as exc:
        return f"the Docker engine does not answer ({exc}); run `make engine`"
    needed = os.environ.get(
        "SANDVISOR_TEST_IMAGES", "sandvisor/minimal:latest sandvisor/debian:latest"
    ).split()
    for image in needed:
        try:
            client.inspect_image(image)
        except Exception:
            return f"image {image} is missing; run `make images`"
    return None


_PROBLEM: str | None = None
_CHECKED = False


def require_engine() -> None:
    """Fail (in CI) or skip (locally) when the engine or images are missing."""
    global _PROBLEM, _CHECKED  # noqa: PLW0603
    if not _CHECKED:
        _PROBLEM = engine_problem()
        _CHECKED = True
    if _PROBLEM is not None:
        if IN_CI:
            pytest.fail(f"CI needs a real engine: {_PROBLEM}", pytrace=False)
        pytest.skip(_PROBLEM)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.fspath)
        for layer in ("unit", "component", "integration", "e2e", "browser", "adversarial"):
            if f"{os.sep}tests{os.sep}{layer}{os.sep}" in path:
                item.add_marker(getattr(pytest.mark, layer))


@pytest.fixture
def policies_dir(tmp_path: Path) -> Path:
    """The shipped policies plus the test-only ones, in a private folder."""
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    for name, text in TEST_POLICIES.items():
        (target / f"{name}.toml").write_text(text)
    return target


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
async def sup(state_dir: Path, policies_dir: Path) -> AsyncIterator[object]:
    require_engine()
    from supervisor import Supervisor  # noqa: PLC0415

    async with Supervisor(state_dir=state_dir, policies_dir=policies_dir) as supervisor:
        yield supervisor


def owned_label() -> dict[str, str]:
    """The label for containers a test creates without the Supervisor."""
    return {"io.sandvisor.test": str(os.getpid())}


def labelled_containers(label: str, value: str) -> list[dict[str, Any]]:
    """Every container (running or not) whose ``label`` is ``value`` (use the names in
    ``supervisor.core.labels``: a misspelt label matches nothing)."""
    import docker  # noqa: PLC0415

    client = docker.APIClient(version="auto", timeout=30)
    try:
        rows: list[dict[str, Any]] = client.containers(
            all=True, filters={"label": f"{label}={value}"}
        )
        return rows
    finally:
        client.close()


@pytest.fixture(scope="session", autouse=True)
def no_leftover_containers() -> Iterator[None]:
    """After the whole run, nothing this test process started may remain on the engine.

    Supervisor containers carry ``io.sandvisor.owner.pid``; containers a test creates directly
    must carry ``io.sandvisor.test=<pid of the test process>`` (see ``owned_label()``)."""
    yield
    try:
        import docker  # noqa: PLC0415

        client = docker.APIClient(version="auto", timeout=10)
        # Only this process's containers: other test runs may share the engine.
        rows = client.containers(
            all=True, filters={"label": f"io.sandvisor.owner.pid={os.getpid()}"}
        )
        rows += client.containers(all=True, filters={"label": f"io.sandvisor.test={os.getpid()}"})
    except Exception:
        return
    for row in rows:
        client.remove_container(row["Id"], force=True)
    if rows:
        names = ", ".join(r["Names"][0] for r in rows)
        raise AssertionError(f"tests left {len(rows)} container(s) behind: {names}")
