"""How the suite runs on parallel workers (``make test`` uses pytest-xdist, ``-n 3``).

Each test file goes to one worker as a whole: its module fixtures (a Swarm lab, a user's
venv, a served daemon) are set up once. The files in a group of ``SAME_WORKER`` share a
worker too, one after the other, because they share something of the host that is not
per test: the Swarm lab's nodes, the test users' uid, the private engines that are
stopped, frozen and restarted.

Tests marked ``serial`` leave the parallel run and run alone after it (``make check``
runs them with ``-m serial``); each mark says why.

Everything else a worker needs of its own it has already: pytest's tmp dirs are per worker
(so are state dirs and sockets), containers carry the test process's pid as their label,
and the images and the shared engine are only read.
"""

from __future__ import annotations

from typing import Any

import pytest

#: Files that run on one worker, in sequence: group name -> files.
SAME_WORKER = {
    "swarm-lab": ("tests/integration/test_swarm_lab.py", "tests/integration/test_swarm_backend.py"),
    "private-engines": (
        "tests/integration/test_engine_restart.py",
        "tests/integration/test_engine_wedge.py",
        "tests/integration/test_engine_fix.py",
        "tests/integration/test_suite_watchdog.py",
        "tests/integration/test_network_reap.py",
    ),
    "host-users": ("tests/e2e/test_wheel_user.py", "tests/e2e/test_workspace_nonroot.py"),
}
_GROUP_OF = {path: name for name, paths in SAME_WORKER.items() for path in paths}


def scope_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its file, or its file's group."""
    path = nodeid.split("::", 1)[0]
    return _GROUP_OF.get(path, path)


def _scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling  # noqa: PLC0415 - only with xdist

    class FileAndGroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """xdist's scope scheduling with ``scope_of`` as the scope."""

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return FileAndGroupScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Our scheduling for ``-n N`` (xdist's default is test by test, which would set up a
    module's fixtures on every worker); an explicit other ``--dist`` is left alone."""
    if config.getoption("dist") not in ("load", "loadfile", "loadscope"):
        return None
    return _scheduler(config, log)
