"""The suite's engine watchdog (issue 29, point 7): a wedged engine stops a pytest run fast.

An inner pytest run watches a private dockerd of this test's own and runs one test that
waits on that engine. The engine is SIGSTOPped (it takes connections and answers nothing,
as a deadlocked engine does). The inner run must stop within seconds of the watchdog's
limit, say that the engine is wedged, and not wait for pytest's per-test timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.engine_watchdog import EXIT_WEDGED
from tests.private_engine import PrivateEngine

REPO = Path(__file__).resolve().parents[2]
WEDGE_S = 4
INNER = """
import os, time
import docker

def test_waits_on_the_engine():
    client = docker.APIClient(base_url=os.environ["DOCKER_HOST"], version="auto", timeout=600)
    open({ready!r}, "w").close()
    while not os.path.exists({frozen!r}):  # the outer test stops the engine
        time.sleep(0.05)
    client.containers(all=True)  # blocks: the engine is stopped
"""


def test_a_wedged_engine_stops_the_run_fast(private_engine: PrivateEngine, tmp_path: Path) -> None:
    ready, frozen = tmp_path / "ready", tmp_path / "frozen"
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "conftest.py").write_text('pytest_plugins = ("tests.engine_watchdog",)\n')
    (inner / "test_inner.py").write_text(INNER.format(ready=str(ready), frozen=str(frozen)))
    env = {
        **os.environ,
        "DOCKER_HOST": private_engine.docker_host,
        "SANDVISOR_TEST_WEDGE_S": str(WEDGE_S),
        "SANDVISOR_TEST_DOCKERD_PIDFILE": str(private_engine.pidfile),
        "PYTHONPATH": str(REPO),
    }
    # SIGINT ignored, as in a run started in the background (CI's): the watchdog must not
    # depend on it.
    proc = subprocess.Popen(
        [
            "sh",
            "-c",
            'trap "" INT; exec "$0" -m pytest -p no:cacheprovider -q "$1"',
            sys.executable,
            str(inner),
        ],
        cwd=inner,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the inner test never started"
            time.sleep(0.05)
        private_engine.freeze()
        frozen.touch()
        frozen_at = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        took = time.monotonic() - frozen_at
    finally:
        private_engine.thaw()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.decode()
    assert proc.returncode == EXIT_WEDGED, text  # stopped, not passed and not timed out
    assert "engine wedged: `docker info` did not answer" in text, text
    assert "the run was stopped by the engine watchdog" in text, text
    # The watchdog's period (10 s) plus its limit, plus the dump's wait: far below pytest's
    # 300 s per-test timeout.
    assert took < 10 + WEDGE_S + 10 + 15, (took, text)


pytestmark = pytest.mark.timeout(240)
