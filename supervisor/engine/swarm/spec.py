"""Pure translation for the Swarm backend: a ContainerRequest as a one-replica job service
(API 1.41, Engine 20.10), what a task's status says, and which hardening settings Swarm
cannot express with what stands in for each (docs/swarm.md lists the same)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor.core.container import ContainerRequest

#: The engine API version the backend speaks: jobs, pids limits, capabilities and ulimits
#: in a service all arrived in 1.41 (Engine 20.10); newer engines accept it too.
API_VERSION = "1.41"
#: The swarm network every task joins instead of ``none`` (which Swarm does not offer to
#: services): an internal overlay, no route out (engine/swarm/network.py says why not a bridge).
ISOLATED_NETWORK = "sandvisor-tasks"
#: Labels the backend adds to every service and container it makes.
LABEL_RUNTIME = "io.sandvisor.swarm.runtime"
LABEL_INFRA = "io.sandvisor.infra"
#: Labels Swarm puts on a task's container.
SWARM_SERVICE = "com.docker.swarm.service.id"
SWARM_TASK = "com.docker.swarm.task.id"
SWARM_NODE = "com.docker.swarm.node.id"
#: Stop grace Swarm uses when it stops a task itself (ours are signalled by us).
STOP_GRACE_NS = 10_000_000_000

#: Hardening settings of the Docker backend that a 1.41 ContainerSpec cannot carry, and
#: what stands in for each on Swarm. Rendered by ``sandvisor doctor`` and docs/swarm.md.
UNEXPRESSED: dict[str, str] = {
    "runtime (runsc per task)": "no per-service runtime: gVisor runs on dedicated nodes whose "
    "engine has runsc as its default runtime; the backend excludes nodes whose default "
    "runtime differs from the policy's, policies add node.labels.sandbox==gvisor, and a "
    "task found on a node with another runtime is killed and fails (fail closed)",
    "network none": "Swarm offers services no `none` network: tasks join sandvisor-tasks, an "
    "internal overlay (no route out of the cluster, DNS pointed at 127.0.0.1), where tasks "
    "CAN reach each other; on gVisor nodes runsc --network=none removes networking outright, "
    "so untrusted code gets no network at all",
    "no-new-privileges": "not in ContainerSpec before API 1.46: every node's engine runs with "
    '"no-new-privileges": true in daemon.json (the lab does); cap_drop ALL leaves setuid '
    "binaries no capabilities either way",
    "memory+swap = memory (no swap)": "MemorySwap cannot be set (Swarm leaves the engine "
    "default, twice the memory limit): run nodes without swap",
    "tmpfs options (nr_inodes, uid/gid, exec)": "a service tmpfs mount takes only size and "
    "mode and is always noexec (and 20.10 drops the mode at the working directory): each "
    "tmpfs is an anonymous volume of the local driver with type=tmpfs and the full option "
    "string instead, removed with the container",
    "stdin EOF (StdinOnce)": "Swarm never sets StdinOnce, so the command can never get EOF on "
    "a piped stdin: send_input(eof=True) is refused; stdin=closed gives /dev/null",
    "IpcMode private": "not settable: the engine's default-ipc-mode (private since 20.10)",
    "workspaces (host mounts)": "a node does not see the supervisor's files: refused",
}


@dataclass(frozen=True)
class TaskStatus:
    """The one task of a job service, as the manager reports it."""

    task_id: str
    state: str
    """new, pending, assigned, accepted, preparing, ready, starting, running, complete,
    failed, shutdown, rejected, orphaned, remove."""
    node_id: str | None
    container_id: str | None
    exit_code: int | None
    error: str
    message: str

    @property
    def started(self) -> bool:
        """The container exists and was started (or already ended)."""
        return self.container_id is not None and self.state in (
            "running",
            "complete",
            "failed",
            "shutdown",
        )

    @property
    def start_failed(self) -> bool:
        """Swarm gave up on it before the command ran (a failed task whose error is not the
        command's own non-zero exit)."""
        return (
            self.state in ("failed", "rejected")
            and bool(self.error)
            and "non-zero exit" not in self.error
        )

    @property
    def refused(self) -> bool:
        """It ended without ever getting a container (rejected, or failed before)."""
        return self.container_id is None and self.state in (
            "rejected",
            "failed",
            "orphaned",
            "remove",
            "shutdown",
        )

    @property
    def unplaceable(self) -> bool:
        """Pending because no node satisfies its constraints."""
        return self.state == "pending" and "no suitable node" in self.error


def task_status(task: dict[str, Any]) -> TaskStatus:
    """A ``GET /tasks`` entry."""
    status = task.get("Status") or {}
    cs = status.get("ContainerStatus") or {}
    return TaskStatus(
        task_id=str(task.get("ID", "")),
        state=str(status.get("State", "new")),
        node_id=task.get("NodeID") or None,
        container_id=cs.get("ContainerID") or None,
        exit_code=cs.get("ExitCode") if status.get("State") in ("complete", "failed") else None,
        error=str(status.get("Err") or ""),
        message=str(status.get("Message") or ""),
    )


def pick_task(tasks: list[dict[str, Any]]) -> TaskStatus | None:
    """The task of a one-replica job (the newest, should Swarm ever make another)."""
    if not tasks:
        return None
    newest = max(tasks, key=lambda t: (t.get("Version") or {}).get("Index", 0))
    return task_status(newest)


def _tmpfs_volume(target: str, options: str, labels: dict[str, str]) -> dict[str, Any]:
    """A tmpfs with every option (size, nr_inodes, mode, uid, gid, exec) as an anonymous
    volume of the local driver: a service's own tmpfs mount cannot carry them."""
    return {
        "Type": "volume",
        "Target": target,
        "ReadOnly": False,
        "VolumeOptions": {
            "NoCopy": True,
            "Labels": dict(labels),
            "DriverConfig": {
                "Name": "local",
                "Options": {"type": "tmpfs", "device": "tmpfs", "o": options},
            },
        },
    }


def service_spec(
    request: ContainerRequest, *, constraints: list[str], network: str = ISOLATED_NETWORK
) -> dict[str, Any]:
    """``POST /services/create`` body: a job that runs once (one replica, never restarted),
    hardened as far as a 1.41 ContainerSpec goes (see UNEXPRESSED). ``constraints`` are the
    policy's placement plus the backend's node exclusions."""
    labels = {**request.labels, LABEL_RUNTIME: request.runtime}
    container: dict[str, Any] = {
        "Image": request.image,
        # Command replaces the image's ENTRYPOINT (the Docker backend's Entrypoint=[]).
        "Command": list(request.command),
        "Args": [],
        "Env": [f"{k}={v}" for k, v in request.env.items()],
        "Labels": labels,
        "User": request.user,
        "Dir": request.working_dir,
        "TTY": False,
        "OpenStdin": request.stdin_open,
        "ReadOnly": request.read_only,
        "Init": request.init,
        "StopSignal": "SIGTERM",
        "StopGracePeriod": STOP_GRACE_NS,
        "CapabilityDrop": ["ALL"],
        "CapabilityAdd": list(request.cap_add),
        "Ulimits": [{"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in request.ulimits],
        "Mounts": [
            _tmpfs_volume(path, options, request.labels) for path, options in request.tmpfs.items()
        ],
        # The embedded DNS would forward names it does not know to the node's resolvers.
        "DNSConfig": {"Nameservers": ["127.0.0.1"]},
    }
    return {
        "Name": request.name,
        "Labels": labels,
        "TaskTemplate": {
            "ContainerSpec": container,
            "Resources": {
                "Limits": {
                    "NanoCPUs": request.nano_cpus,
                    "MemoryBytes": request.memory_bytes,
                    "Pids": request.pids_limit,
                }
            },
            "RestartPolicy": {"Condition": "none", "MaxAttempts": 0},
            "Placement": {"Constraints": list(constraints)},
            "Networks": [{"Target": network}],
            "LogDriver": {
                "Name": "json-file",
                "Options": {
                    "max-size": request.log_max_size,
                    "max-file": str(request.log_max_files),
                },
            },
        },
        "Mode": {"ReplicatedJob": {"MaxConcurrent": 1, "TotalCompletions": 1}},
    }
