"""Tasks started through the API, announced at once to the dashboard's merged event streams
(a task's first event, ``task.started``, comes only once its container runs: under load,
seconds later)."""

from __future__ import annotations

import weakref
from collections.abc import Callable

from supervisor.core.models import TaskInfo
from supervisor.runtime.supervisor import Supervisor

#: A listener: takes a task just created (it must not block; it may drop it when full).
Listener = Callable[[TaskInfo], None]


class TaskFeed:
    """The listeners of one supervisor, shared by every app over it (unix socket and TCP)."""

    def __init__(self) -> None:
        self._listeners: set[Listener] = set()

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Add ``listener``; returns what removes it."""
        self._listeners.add(listener)
        return lambda: self._listeners.discard(listener)

    def announce(self, info: TaskInfo) -> None:
        for listener in list(self._listeners):
            listener(info)


_FEEDS: weakref.WeakKeyDictionary[Supervisor, TaskFeed] = weakref.WeakKeyDictionary()


def feed_of(sup: Supervisor) -> TaskFeed:
    """The feed of ``sup`` (made on first use)."""
    feed = _FEEDS.get(sup)
    if feed is None:
        feed = _FEEDS[sup] = TaskFeed()
    return feed


def sse_created(info: TaskInfo) -> bytes:
    """``event: task.created``, the TaskInfo as data, no ``id`` (it is not a session event)."""
    return f"event: task.created\ndata: {info.model_dump_json()}\n\n".encode()
