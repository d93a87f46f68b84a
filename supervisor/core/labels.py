"""Container labels: every container the supervisor makes carries ``io.sandvisor.*`` labels, so
a restarted supervisor can re-adopt or reap it; unlabelled containers are never touched."""

from __future__ import annotations

from typing import Any

LABEL_PREFIX = "io.sandvisor."
#: The instance (state dir) that made the container.
LABEL_OWNER = "io.sandvisor.owner"
#: The session and task a container belongs to.
LABEL_SESSION = "io.sandvisor.session"
LABEL_TASK = "io.sandvisor.task"
#: ``background``, ``monitor``, or ``pooled`` (made for a warm pool; it may have become a
#: task since: the task's record binds it).
LABEL_KIND = "io.sandvisor.kind"


def container_labels(owner: dict[str, str], **fields: Any) -> dict[str, str]:
    """Owner labels plus ``io.sandvisor.<field>`` (``session_id`` -> ``io.sandvisor.session``,
    ``task_id`` -> ``io.sandvisor.task``, ``timeout_ms`` -> ``io.sandvisor.timeout-ms``)."""
    labels = dict(owner)
    for key, value in fields.items():
        name = key.removesuffix("_id").replace("_", "-")
        labels[LABEL_PREFIX + name] = "" if value is None else str(value)
    return labels
