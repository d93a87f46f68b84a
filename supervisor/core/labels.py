"""Container labels: every container the supervisor makes carries ``io.sbx.*`` labels, so
a restarted supervisor can re-adopt or reap it; unlabelled containers are never touched."""

from __future__ import annotations

from typing import Any

LABEL_PREFIX = "io.sbx."
#: The instance (state dir) that made the container.
LABEL_OWNER = "io.sbx.owner"
#: The session and task a container belongs to.
LABEL_SESSION = "io.sbx.session"
LABEL_TASK = "io.sbx.task"
#: ``background``, ``monitor``, or ``pooled`` (made for a warm pool; it may have become a
#: task since: the task's record binds it).
LABEL_KIND = "io.sbx.kind"


def container_labels(owner: dict[str, str], **fields: Any) -> dict[str, str]:
    """Owner labels plus ``io.sbx.<field>`` (``session_id`` -> ``io.sbx.session``,
    ``task_id`` -> ``io.sbx.task``, ``timeout_ms`` -> ``io.sbx.timeout-ms``)."""
    labels = dict(owner)
    for key, value in fields.items():
        name = key.removesuffix("_id").replace("_", "-")
        labels[LABEL_PREFIX + name] = "" if value is None else str(value)
    return labels
