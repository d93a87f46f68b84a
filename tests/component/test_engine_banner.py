"""What the dashboard's engine banner reads (issue 29, point 2): its event streams, asked
with ``engine=true`` on the dashboard's cookie, say ``up``, ``wedged`` and ``down`` as the
watchdog decides, within seconds, to the admin's login and to a session's; the admin's
also names the engine's version and, for Docker 20.10, its known deadlocks. On the
in-process daemon (its TCP app with the dashboard, over real HTTP: the streams never end)
on the fake engine."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from supervisor.core.engine_versions import DEADLOCK_NOTE
from supervisor.engine.base import Backend
from supervisor.engine.deadlines import Deadlines, deadlines_for
from supervisor.engine.fake import FakeBackend
from tests.component.daemon_app import ListeningDaemon, listening_daemon
from tests.component.test_doctor_fix import Engine2010
from tests.ui_login import Login, login_page

pytestmark = [pytest.mark.component, pytest.mark.timeout(60)]

#: Every engine call's deadline: the watchdog's canary then counts as hung after half.
DEADLINE = 1.0
#: How soon a stream must tell a change: the canary's limit, the watchdog's and the
#: stream's one-second looks, and room for a loaded 2-core machine.
FEW_S = 5.0
#: A state as a stream says it, once for any principal.
Status = dict[str, Any]


def bounded_2010(backend: FakeBackend) -> Backend:
    """The fake, saying it is Docker 20.10, every call bounded at DEADLINE."""
    return Deadlines(Engine2010(backend), deadlines_for(DEADLINE))


def login(d: ListeningDaemon, token: str | None = None) -> Login:
    """Open a new login link (the admin's, or a session token's) as a browser does."""
    cookie, found = login_page(d, token)
    assert found is not None, "the login page carries no CSRF token"
    return Login(cookie, found.group(1))


@contextmanager
def engine_states(
    d: ListeningDaemon, who: Login, path: str
) -> Iterator[Callable[[Callable[[Status], bool]], Status]]:
    """The stream at ``path`` with ``engine=true``, on the cookie (the CSRF token in the
    query, as EventSource sends it); yields ``until(check)``: the next ``engine.state``
    data for which ``check`` holds."""
    query = f"engine=true&sandvisor_csrf={who.csrf}"
    with (
        httpx.Client(base_url=f"http://{d.tcp}", timeout=30) as client,
        client.stream("GET", f"{path}?{query}", headers={"Cookie": who.cookie}) as r,
    ):
        assert r.status_code == 200, r.read()
        lines = r.iter_lines()

        def until(check: Callable[[Status], bool]) -> Status:
            event = None
            for line in lines:
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event == "engine.state":
                    status: Status = json.loads(line.removeprefix("data: "))
                    if check(status):
                        return status
            raise AssertionError("the stream ended")

        yield until


def first(status: Status) -> bool:
    return True


def state_is(state: str) -> Callable[[Status], bool]:
    return lambda status: status["state"] == state


def start_answer(d: ListeningDaemon) -> tuple[int, str]:
    """A start's answer now: its status and error code."""
    with d.client() as api:
        r = api.post("/sessions/s1/tasks", json={"command": "true", "policy": "fast"})
    return r.status_code, r.json()["error"]["code"] if r.is_error else ""


def test_the_dashboards_streams_say_up_wedged_and_down(tmp_path: Path, policies_dir: Path) -> None:
    state = tmp_path / "state"
    with listening_daemon(state, policies_dir, ui=True, backend=bounded_2010) as d:
        engine = d.daemon.engine
        with d.client() as api:
            r = api.post("/sessions", json={"session_id": "s1"})
            assert r.status_code == 201, r.text
            own = login(d, r.json()["token"])
        admin = login(d)
        with (
            engine_states(d, admin, "/events/stream") as merged,
            engine_states(d, own, "/sessions/s1/events/stream") as mine,
        ):
            # At once: up, with the version and its known deadlocks for the admin only.
            version = "20.10.24+dfsg1"
            up = {"state": "up", "detail": None}
            assert merged(first) == {**up, "version": version, "warning": DEADLOCK_NOTE}
            assert mine(first) == {**up, "version": None, "warning": None}

            # Its listings hang: wedged within seconds, and starts refused as the banner says.
            began = time.monotonic()
            release = d.call(engine.wedge, "list_labeled")
            wedged = merged(state_is("wedged"))
            assert time.monotonic() - began < FEW_S
            assert wedged["detail"] and wedged["version"] == version
            seen = mine(state_is("wedged"))
            assert seen["detail"] and seen["version"] is None and seen["warning"] is None
            assert start_answer(d) == (503, "engine_unresponsive")

            d.call(release.set)
            assert merged(state_is("up")) == {**up, "version": version, "warning": DEADLOCK_NOTE}
            assert mine(state_is("up")) == {**up, "version": None, "warning": None}

            # It stops answering: down, and starts fail as engine_unavailable.
            began = time.monotonic()
            d.call(engine.go_down)
            down = merged(state_is("down"))
            assert time.monotonic() - began < FEW_S
            assert down["detail"]
            assert mine(state_is("down"))["detail"]
            assert start_answer(d) == (503, "engine_unavailable")

            d.call(engine.restore)
            merged(state_is("up"))
            mine(state_is("up"))
            assert start_answer(d)[0] == 201


def test_a_stream_without_engine_true_carries_no_engine_state(
    tmp_path: Path, policies_dir: Path
) -> None:
    """Other readers of the streams (``top``, the tests of the fleet API) see nothing new."""
    with listening_daemon(tmp_path / "state", policies_dir, ui=True) as d:
        with d.client() as api:
            assert api.post("/sessions", json={"session_id": "s1"}).status_code == 201
            with api.stream("GET", "/events/stream") as r:
                lines = r.iter_lines()
                assert next(lines) == ": connected"
                # A task's events come through, and nothing about the engine before them.
                assert start_answer(d)[0] == 201
                for line in lines:
                    assert "engine.state" not in line
                    if line == "event: task.started":
                        break
