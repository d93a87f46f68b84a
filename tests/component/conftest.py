"""Component tests: the runtime (runner, session, pool, stall watching, supervisor) and the
daemon's HTTP API (in-process, tests/component/daemon_app.py) on the fake engine of
supervisor/engine/fake. No Docker: they run with DOCKER_HOST pointing nowhere."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from supervisor import BaseEvent, MemorySink, Session, Supervisor
from supervisor.engine.deadlines import Deadlines, deadlines_for
from supervisor.engine.fake import FakeContainer, FakeEngine, LoopClock
from tests.component.daemon_app import InProcessDaemon, in_process_daemon
from tests.conftest import POLICIES

#: Policies of the component tests: the minimal image, short grace periods (a stop whose
#: SIGTERM is ignored escalates quickly), monitor lines as events at once, no stall
#: watching unless a test asks for it.
#: The end of most component policies: a short grace, no stall detection.
QUIET = """[timeouts]
grace_s = 0.2
[watch]
stall_detection = false
"""

COMPONENT_POLICIES = {
    "fake": """
description = "component tests: 0.2 s grace, no stall watching"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
grace_s = 0.2
[env]
allow = ["*"]
[watch]
stall_detection = false
[monitor]
batch_window_ms = 0
""",
    "warm": """
description = "component tests: a warm pool of 2"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
warm_pool = 2
[timeouts]
grace_s = 0.2
[env]
allow = ["*"]
[watch]
stall_detection = false
[session]
max_running_tasks = 4
""",
    "stall": """
description = "component tests: stall watching after 0.5 s"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
grace_s = 0.2
[watch]
stall_after_s = 0.5
""",
    "capped": f"""
description = "component tests: at most 5 running tasks per session"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[session]
max_running_tasks = 5
{QUIET}""",
    "net-session": f"""
description = "component tests: the session's internal network"
image = "sandvisor/minimal:latest"
network = "session"
{QUIET}""",
    "net-bridge": f"""
description = "component tests: the session's network with egress"
image = "sandvisor/minimal:latest"
network = "bridge"
{QUIET}""",
    "net-warm": f"""
description = "component tests: the session's network, a warm pool of the session's own"
image = "sandvisor/minimal:latest"
network = "session"
warm_pool = 1
{QUIET}""",
    "small-layer": f"""
description = "component tests: a 1 MB, 50-entry workspace layer"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[session]
workspace_max_mb = 1
workspace_max_files = 50
{QUIET}""",
    "roomy": """
description = "component tests: at most 8 running tasks per session"
image = "sandvisor/minimal:latest"
working_dir = "/tmp"
[timeouts]
grace_s = 0.2
[watch]
stall_detection = false
[session]
max_running_tasks = 8
""",
}


class Runtime:
    """Supervisors on one state dir and one fake engine; :meth:`restart` is what a daemon
    restart looks like (tasks left running, a new client of the same engine)."""

    def __init__(self, engine: FakeEngine, state_dir: Path, policies_dir: Path) -> None:
        self.engine = engine
        self.state_dir = state_dir
        self.policies_dir = policies_dir
        self.opened: list[Supervisor] = []
        self.workspace_roots: list[Path] = []

    async def supervisor(self, *, stop_tasks_on_close: bool = True) -> Supervisor:
        sup = Supervisor(
            state_dir=self.state_dir,
            policies_dir=self.policies_dir,
            backend=self.engine.backend(),
            stop_tasks_on_close=stop_tasks_on_close,
            workspace_roots=self.workspace_roots,
        )
        await sup.start()
        self.opened.append(sup)
        return sup

    async def release(self, sup: Supervisor) -> None:
        """Close without stopping tasks (as the daemon does): containers and records stay."""
        sup.stop_tasks_on_close = False
        await sup.aclose()

    async def restart(self, sup: Supervisor) -> Supervisor:
        await self.release(sup)
        return await self.supervisor()

    async def aclose(self) -> None:
        for sup in self.opened:
            await sup.aclose()


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    # Real time for log stamps (the re-attach finds the log's new part by message times);
    # scripts wait on events the tests set, never on the clock.
    async with FakeEngine(clock=LoopClock()) as fake:
        yield fake


@asynccontextmanager
async def bounded_supervisor(
    engine: FakeEngine, state_dir: Path, policies_dir: Path, deadline_s: float, **options: Any
) -> AsyncIterator[Supervisor]:
    """A started Supervisor on ``engine`` with every engine call bounded at ``deadline_s``."""
    sup = Supervisor(
        state_dir=state_dir,
        policies_dir=policies_dir,
        backend=Deadlines(engine.backend(), deadlines_for(deadline_s)),
        **options,
    )
    await sup.start()
    try:
        yield sup
    finally:
        await sup.aclose()


@asynccontextmanager
async def reconciling(sup: Supervisor) -> AsyncIterator[None]:
    """The reconciler's loop at a short interval (the supervisor's own runs every 10 s)."""
    loop = asyncio.create_task(sup.reconciler.run(every_s=0.05))
    try:
        yield
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


@pytest.fixture
def fake_policies(tmp_path: Path) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(POLICIES, target)
    for name, text in COMPONENT_POLICIES.items():
        (target / f"{name}.toml").write_text(text)
    return target


@pytest.fixture
async def runtime(
    engine: FakeEngine, tmp_path: Path, fake_policies: Path
) -> AsyncIterator[Runtime]:
    rt = Runtime(engine, tmp_path / "state", fake_policies)
    try:
        yield rt
    finally:
        await rt.aclose()


@pytest.fixture
async def sup(runtime: Runtime) -> Supervisor:
    return await runtime.supervisor()


@pytest.fixture
async def daemon(
    engine: FakeEngine, tmp_path: Path, policies_dir: Path
) -> AsyncIterator[InProcessDaemon]:
    """The daemon in-process (tests/component/daemon_app.py) on the fake engine, as the e2e
    ``daemon`` fixture starts one: its own state dir, the test policies, stopping its tasks
    at the end, ``<tmp_path>/projects`` its one workspace root."""
    root = tmp_path / "projects"
    root.mkdir(exist_ok=True)
    async with in_process_daemon(
        tmp_path / "state", policies_dir, engine=engine, workspace_roots=[root]
    ) as d:
        yield d


@pytest.fixture
def sink() -> MemorySink:
    return MemorySink()


@pytest.fixture
async def session(sup: Supervisor, sink: MemorySink) -> Session:
    return await sup.open_session("s1", sinks=[sink])


# -- helpers -----------------------------------------------------------------------------


def container(engine: FakeEngine, task_id: str) -> FakeContainer:
    """The task's container (named after the task, removed ones included)."""
    return engine.container(f"sandvisor-{task_id}")


async def stored_events(session: Session) -> list[BaseEvent]:
    """Every event the session's log holds, in seq order (checked strictly increasing)."""
    events = [e async for e in session.events(0, follow=False)]
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)), f"seq not strictly increasing: {seqs}"
    return events


def of_task(events: Iterable[BaseEvent], task_id: str, *types: str) -> list[BaseEvent]:
    return [e for e in events if e.task_id == task_id and (not types or e.type in types)]


def types_of(events: Iterable[BaseEvent], task_id: str) -> list[str]:
    """A task's event types in order (monitor lines and polls left out)."""
    skip = {"task.output", "task.output_suppressed", "task.poll"}
    return [e.type for e in events if e.task_id == task_id and e.type not in skip]


def is_event(task_id: str, kind: str) -> Callable[[BaseEvent], bool]:
    return lambda e: e.task_id == task_id and e.type == kind


def calls_for(engine: FakeEngine, cid: str, since: int = 0) -> list[str]:
    """The backend calls made on one container, in order (from call ``since`` on)."""
    return [method for method, target in engine.calls[since:] if target == cid]


async def removed(engine: FakeEngine, task_id: str) -> bool:
    """Wait until the task's container is removed (that follows the terminal event)."""
    c = container(engine, task_id)
    await engine.changes.until(lambda: c.removed)
    return True


async def called(engine: FakeEngine, method: str, target: str, since: int = 0) -> None:
    """Wait until the engine got a call of ``method`` on ``target`` (from call ``since`` on)."""
    await engine.changes.until(lambda: (method, target) in engine.calls[since:])
