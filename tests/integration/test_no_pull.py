"""Images are never pulled implicitly: a task whose image is missing fails at once, naming the
image and the command that builds it, and no request reaches a registry (checked two ways:
the engine's event stream has no ``pull`` event, and a registry of our own on 127.0.0.1,
which the engine would talk to without TLS, sees no request). ``pull = true`` is the one
way to let the engine ask a registry, and the same registry proves that it then does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import docker
import pytest

from supervisor import Supervisor, TaskSpec
from tests.conftest import require_engine

pytestmark = pytest.mark.timeout(120)


class Registry:
    """A registry that has no images: it records every request and answers 404."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(f"GET {self.path}")
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"errors":[{"code":"NAME_UNKNOWN","message":"unknown"}]}')

            do_HEAD = do_GET

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def registry() -> Iterator[Registry]:
    reg = Registry()
    try:
        yield reg
    finally:
        reg.close()


def pull_events(since: float) -> list[dict[str, Any]]:
    client = docker.APIClient(version="auto", timeout=30)
    try:
        stream = client.events(
            since=int(since), until=int(time.time()) + 1, decode=True, filters={"type": "image"}
        )
        return [e for e in stream if e.get("Action") == "pull"]
    finally:
        client.close()


def write_policy(policies_dir: Path, name: str, image: str, *, pull: bool) -> None:
    (policies_dir / f"{name}.toml").write_text(
        f'image = "{image}"\nworking_dir = "/tmp"\npull = {str(pull).lower()}\n'
    )


async def test_a_missing_image_fails_at_once_and_reaches_no_registry(
    state_dir: Path, policies_dir: Path, registry: Registry
) -> None:
    require_engine()
    foreign = f"127.0.0.1:{registry.port}/someone/else:latest"
    write_policy(policies_dir, "foreign", foreign, pull=False)
    began = time.time()
    async with Supervisor(state_dir=state_dir, policies_dir=policies_dir) as sup:
        session = await sup.open_session("nopull")
        ours = await session.start(TaskSpec(command="echo hi", policy="missingimage"))
        theirs = await session.start(TaskSpec(command="echo hi", policy="foreign"))
        a = await session.wait(ours.task_id, timeout_s=30)
        b = await session.wait(theirs.task_id, timeout_s=30)
    assert (a.status, a.error_code) == ("failed", "image_missing")
    assert "'sandvisor/does-not-exist:latest'" in (a.error or "")
    assert "`sandvisor images build does-not-exist`" in (a.error or "")
    assert (b.status, b.error_code) == ("failed", "image_missing")
    assert repr(foreign) in (b.error or "") and "pull = true" in (b.error or "")
    assert time.time() - began < 20  # at once: no pull attempt, no retry loop
    assert registry.requests == []
    assert pull_events(began) == []


async def test_pull_true_is_the_one_way_to_reach_a_registry(
    state_dir: Path, policies_dir: Path, registry: Registry
) -> None:
    require_engine()
    image = f"127.0.0.1:{registry.port}/someone/else:latest"
    write_policy(policies_dir, "pulling", image, pull=True)
    async with Supervisor(state_dir=state_dir, policies_dir=policies_dir) as sup:
        session = await sup.open_session("pull")
        task = await session.start(TaskSpec(command="echo hi", policy="pulling"))
        final = await session.wait(task.task_id, timeout_s=60)
    # The engine did ask our registry (which has nothing), and the task says so.
    assert any(r.startswith("GET /v2/") for r in registry.requests), registry.requests
    assert (final.status, final.error_code) == ("failed", "image_missing")
    assert repr(image) in (final.error or "") and "pulling it failed" in (final.error or "")
