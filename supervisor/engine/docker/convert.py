"""Translation between our value types and the Docker Engine API: the create body from a
ContainerRequest, ContainerState from an inspect answer, docker-py errors to our tree. Pure."""

from __future__ import annotations

from typing import Any

import docker.errors
import requests.exceptions

from supervisor.core.container import ContainerRequest, ContainerState, Mount
from supervisor.core.errors import (
    EngineError,
    EngineUnavailable,
    ImageMissing,
    RuntimeUnavailable,
    SupervisorError,
)


def root_cause(exc: BaseException) -> str:
    """The OS-level reason under docker-py's and requests' wrappers (``Connection refused``),
    else the error's own text."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        # requests' errors are OSErrors too, but only the kernel's carry a strerror.
        if isinstance(current, OSError) and current.strerror:
            return current.strerror
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        linked += [a for a in current.args if isinstance(a, BaseException)]
        todo += [e for e in linked if isinstance(e, BaseException)]
    return str(exc)


def translate_error(exc: BaseException, what: str) -> SupervisorError:
    """Map docker-py / requests errors to our tree (the one translator: the backend and the
    image tooling both use it)."""
    if isinstance(exc, SupervisorError):
        return exc
    if isinstance(exc, docker.errors.ImageNotFound):
        return ImageMissing(f"{what}: image not found: {exc.explanation or exc}")
    if isinstance(exc, docker.errors.APIError):
        return _api_error(exc, what)
    if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError, OSError)):
        return EngineUnavailable(f"{what}: the Docker engine does not answer ({root_cause(exc)})")
    if isinstance(exc, docker.errors.DockerException):
        return EngineUnavailable(f"{what}: {exc}")
    return EngineError(f"{what}: {type(exc).__name__}: {exc}")


def _api_error(exc: docker.errors.APIError, what: str) -> SupervisorError:
    """The engine answered with an error status: which of ours it is, by its text."""
    text = str(exc.explanation or exc)
    if "unknown or invalid runtime" in text or ("runtime" in text and "not" in text):
        return RuntimeUnavailable(f"{what}: {text}")
    if exc.status_code == 404 and "No such image" in text:
        return ImageMissing(f"{what}: {text}")
    return EngineError(f"{what}: {text}")


def state_from_inspect(data: dict[str, Any]) -> ContainerState:
    """A container's state from ``GET /containers/{id}/json``."""
    state = data.get("State") or {}
    config = data.get("Config") or {}
    return ContainerState(
        id=data["Id"],
        status=state.get("Status", "unknown"),
        running=bool(state.get("Running")),
        exit_code=state.get("ExitCode") if state.get("Status") in ("exited", "dead") else None,
        oom_killed=bool(state.get("OOMKilled")),
        error=state.get("Error") or None,
        started_at=state.get("StartedAt"),
        finished_at=state.get("FinishedAt"),
        labels=config.get("Labels") or {},
        pid=state.get("Pid") or None,
        runtime=(data.get("HostConfig") or {}).get("Runtime"),
    )


def _mount(m: Mount) -> dict[str, Any]:
    body: dict[str, Any] = {
        "Type": m.type,
        "Source": m.source,
        "Target": m.target,
        "ReadOnly": m.read_only,
    }
    if m.type == "bind":
        body["BindOptions"] = {"Propagation": "rprivate", "NonRecursive": m.non_recursive}
    else:
        # Never copy the image's files at the target into the volume (it is the workspace).
        body["VolumeOptions"] = {"NoCopy": True}
    return body


def request_to_config(req: ContainerRequest) -> dict[str, Any]:
    """Engine API body for POST /containers/create (pure; tested without an engine)."""
    host_config: dict[str, Any] = {
        "NetworkMode": req.network,
        "CapDrop": ["ALL"],
        "CapAdd": list(req.cap_add),
        "SecurityOpt": ["no-new-privileges:true"],
        "Privileged": False,
        "ReadonlyRootfs": req.read_only,
        "Tmpfs": dict(req.tmpfs),
        "Memory": req.memory_bytes,
        "MemorySwap": req.memory_bytes,
        "NanoCpus": req.nano_cpus,
        "PidsLimit": req.pids_limit,
        "Ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in req.ulimits],
        "Init": req.init,
        "Runtime": req.runtime,
        "AutoRemove": False,
        "RestartPolicy": {"Name": "no"},
        "IpcMode": "private",
        "LogConfig": {
            "Type": "json-file",
            "Config": {"max-size": req.log_max_size, "max-file": str(req.log_max_files)},
        },
        "Mounts": [_mount(m) for m in req.mounts],
    }
    config: dict[str, Any] = {
        "Image": req.image,
        "Cmd": list(req.command),
        "Entrypoint": [],
        "Env": [f"{k}={v}" for k, v in req.env.items()],
        "Labels": dict(req.labels),
        "User": req.user,
        "WorkingDir": req.working_dir,
        "Tty": False,
        "OpenStdin": req.stdin_open,
        # StdinOnce: when our attach half-closes, the engine closes the command's stdin
        # (that is how send_input(eof=True) works). The price: if the supervisor dies, the
        # dropped connection also gives the command EOF. See README "Crash semantics".
        "StdinOnce": req.stdin_open,
        "AttachStdin": req.stdin_open,
        "AttachStdout": True,
        "AttachStderr": True,
        "StopSignal": "SIGTERM",
        "HostConfig": host_config,
    }
    if req.network not in ("none", "host", "bridge", "default") and req.network_aliases:
        config["NetworkingConfig"] = {
            "EndpointsConfig": {req.network: {"Aliases": list(req.network_aliases)}}
        }
    return config
