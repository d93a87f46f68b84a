"""The Swarm backend's pure parts: placement constraints, a request as a job service, and
what a task's status says."""

from __future__ import annotations

import pytest

from supervisor.core.container import ContainerRequest, Ulimit
from supervisor.core.placement import matches_all, parse_constraint
from supervisor.engine.swarm.spec import (
    ISOLATED_NETWORK,
    UNEXPRESSED,
    pick_task,
    service_spec,
    task_status,
)

NODE = {
    "node.hostname": "sandvisor-lab-w2",
    "node.role": "worker",
    "node.labels.sandbox": "gvisor",
}


def test_constraints_parse_and_match_like_swarm() -> None:
    gvisor = parse_constraint("node.labels.sandbox == gvisor")
    assert str(gvisor) == "node.labels.sandbox==gvisor"
    assert matches_all([gvisor], NODE)
    assert not matches_all([gvisor], {"node.hostname": "w1"})
    # A missing attribute equals nothing, so != holds; names compare case-insensitively.
    assert parse_constraint("node.labels.zone!=eu").matches(NODE)
    assert parse_constraint("node.hostname==SANDVISOR-LAB-W2").matches(NODE)
    assert not parse_constraint("node.labels.sandbox==GVISOR").matches(NODE)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("sandbox", "KEY==VALUE"),
        ("node.colour==red", "unknown key"),
        ("node.labels.a==x y", "plain word"),
    ],
)
def test_bad_constraints_are_refused_saying_why(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_constraint(text)


def request(**fields: object) -> ContainerRequest:
    base: dict[str, object] = {
        "name": "sandvisor-bg-1",
        "image": "sandvisor/minimal:latest",
        "command": ["sh", "-c", "echo hi"],
        "labels": {"io.sandvisor.task": "bg-1"},
        "user": "65534:65534",
        "working_dir": "/tmp",
        "memory_bytes": 256 << 20,
        "nano_cpus": 1_000_000_000,
        "pids_limit": 256,
        "tmpfs": {"/tmp": "size=64m,nr_inodes=16384,mode=1777"},
        "ulimits": [Ulimit(name="nofile", soft=1024, hard=1024)],
        "placement": ["node.labels.sandbox==gvisor"],
    }
    base.update(fields)
    return ContainerRequest.model_validate(base)


def test_a_request_is_a_hardened_one_shot_job() -> None:
    spec = service_spec(request(), constraints=["node.labels.sandbox==gvisor", "node.id!=x"])
    assert spec["Mode"] == {"ReplicatedJob": {"MaxConcurrent": 1, "TotalCompletions": 1}}
    template = spec["TaskTemplate"]
    assert template["RestartPolicy"]["Condition"] == "none"
    assert template["Placement"]["Constraints"] == ["node.labels.sandbox==gvisor", "node.id!=x"]
    assert template["Networks"] == [{"Target": ISOLATED_NETWORK}]
    assert template["Resources"]["Limits"] == {
        "NanoCPUs": 1_000_000_000,
        "MemoryBytes": 256 << 20,
        "Pids": 256,
    }
    c = template["ContainerSpec"]
    assert c["CapabilityDrop"] == ["ALL"] and c["ReadOnly"] is True and c["Init"] is True
    assert c["Ulimits"] == [{"Name": "nofile", "Soft": 1024, "Hard": 1024}]
    assert (
        c["Labels"]["io.sandvisor.task"] == "bg-1" and spec["Labels"]["io.sandvisor.task"] == "bg-1"
    )
    (tmp,) = c["Mounts"]  # a tmpfs volume: a service tmpfs cannot take nr_inodes
    assert tmp["Target"] == "/tmp"
    assert tmp["VolumeOptions"]["DriverConfig"]["Options"]["o"] == (
        "size=64m,nr_inodes=16384,mode=1777"
    )
    assert "no-new-privileges" in UNEXPRESSED and "runtime (runsc per task)" in UNEXPRESSED


def test_task_status_tells_exit_from_a_failed_start() -> None:
    exited = task_status(
        {
            "ID": "t",
            "NodeID": "n",
            "Status": {
                "State": "failed",
                "Err": "task: non-zero exit (3)",
                "ContainerStatus": {"ContainerID": "c", "ExitCode": 3},
            },
        }
    )
    assert exited.started and exited.exit_code == 3 and not exited.start_failed
    refused = task_status(
        {"ID": "t", "NodeID": "n", "Status": {"State": "rejected", "Err": "network x exists"}}
    )
    assert refused.start_failed and not refused.started
    newest = pick_task(
        [
            {"ID": "old", "Version": {"Index": 1}, "Status": {"State": "failed"}},
            {"ID": "new", "Version": {"Index": 9}, "Status": {"State": "running"}},
        ]
    )
    assert newest is not None and newest.task_id == "new"
