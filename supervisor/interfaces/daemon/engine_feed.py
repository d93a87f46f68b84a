"""The engine's state on the event streams, for the dashboard's banner: asked with
``engine=true``, a stream sends ``engine.state`` (data: ``EngineStatus``; no ``id``, it is
not a session event) when it opens and again whenever the state or why changes. The stream
only reads the watchdog's verdict (runtime/engine_checks.py), about once a second; it never
asks the engine itself."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from supervisor.core.engine_versions import DEADLOCK_NOTE, deadlock_prone
from supervisor.interfaces.daemon.auth import Principal
from supervisor.interfaces.daemon.deps import BOOLEAN
from supervisor.interfaces.daemon.replies import EngineStatus
from supervisor.runtime.supervisor import Supervisor

#: How often a stream that carries the engine's state looks at it.
ENGINE_EVERY_S = 1.0

#: ``engine=true``: the stream also carries ``engine.state``.
EngineFlag = Annotated[
    bool,
    Query(
        description="Also send `engine.state` (data: `{state, detail, version, warning}`, "
        "no `id`) at once and whenever the engine's state changes (the dashboard's banner)"
    ),
    BOOLEAN,
]


def engine_status(sup: Supervisor, who: Principal) -> EngineStatus:
    """The engine's state and why, for anyone logged in (every user of the daemon is refused
    starts while it is not up); its version and known deadlocks for the admin only, as in
    ``/healthz``."""
    state = sup.engine_state
    detail = (sup.checks.engine_state_detail or None) if state != "up" else None
    if not who.admin:
        return EngineStatus(state=state, detail=detail)
    version = sup.engine_info.get("version")
    warning = DEADLOCK_NOTE if version and deadlock_prone(version) else None
    return EngineStatus(state=state, detail=detail, version=version, warning=warning)


class EngineNews:
    """One stream's ``engine.state`` messages: the first at once, then one per change."""

    def __init__(self, sup: Supervisor, who: Principal) -> None:
        self._sup = sup
        self._who = who
        self._sent: EngineStatus | None = None

    def poll(self) -> bytes | None:
        """The message to send now, or None when nothing changed since the last one."""
        status = engine_status(self._sup, self._who)
        if status == self._sent:
            return None
        self._sent = status
        return f"event: engine.state\ndata: {status.model_dump_json()}\n\n".encode()
