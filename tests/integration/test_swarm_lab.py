"""The 3-node Swarm lab (scripts/swarm-lab.sh): Ready nodes with their roles and labels, a
job placed on the gVisor node by constraint and run under runsc, and node loss by a cut link."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import docker
import pytest
from docker.types import RestartPolicy, ServiceMode

from tests.conftest import REPO, require_engine

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(900)]

SCRIPT = REPO / "scripts" / "swarm-lab.sh"
HOSTNAMES = {"manager": "sandvisor-lab-manager", "w1": "sandvisor-lab-w1", "w2": "sandvisor-lab-w2"}
#: A cold `up` copies the images to three engines; on this machine that is about a minute.
UP_TIMEOUT_S = 600
#: How long the manager may take to see a cut node as down (5 s heartbeats: about 13 s here).
NODE_DOWN_S = 60
NODE_READY_S = 60


@dataclass(frozen=True)
class Lab:
    """The running lab: the manager's endpoint and each node's own engine."""

    docker_host: str
    """``unix:///…/n1.sock``: what ``up`` printed as its last line."""
    engines: dict[str, str]
    """Lab node name (manager, w1, w2) → that node's engine endpoint."""
    was_up: bool
    """The lab was running before this test run: leave it running afterwards."""
    up_s: float
    """How long this run's ``up`` took."""


def run_lab(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )


def poll_until(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Wait for a condition; returns the seconds it took, fails the test after ``timeout_s``."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.2)
    return time.monotonic() - start


def lab_problem() -> str | None:
    if os.geteuid() != 0:
        return "the Swarm lab needs root (network namespaces, private dockerd)"
    for tool in ("ip", "nsenter", "unshare", "dockerd", "containerd", "runsc", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed; run `make engine`"
    return None


def engines_from_env() -> tuple[str, dict[str, str]]:
    """The endpoints the script uses (it honours SANDVISOR_LAB_* variables, so ask it)."""
    out = run_lab("env")
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    engines = {name: values[f"SANDVISOR_LAB_{name.upper()}_HOST"] for name in HOSTNAMES}
    return values["DOCKER_HOST"], engines


def answers(base_url: str) -> bool:
    try:
        client = docker.APIClient(base_url=base_url, version="auto", timeout=5)
    except Exception:
        return False
    try:
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """The lab, brought up (or reused: ``up`` on a running lab only checks and repairs it).
    Torn down afterwards only when this session started it."""
    require_engine()  # the images come from the host engine
    problem = lab_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs the Swarm lab: {problem}", pytrace=False)
        pytest.skip(problem)
    manager, engines = engines_from_env()
    was_up = answers(manager)
    start = time.monotonic()
    up = run_lab("up", timeout_s=UP_TIMEOUT_S)
    up_s = time.monotonic() - start
    try:
        assert up.returncode == 0, f"swarm-lab up failed:\n{up.stderr[-3000:]}"
        assert up.stdout.splitlines()[-1] == f"DOCKER_HOST={manager}", up.stdout
        print(f"\nswarm-lab up: {up_s:.1f} s ({'reused' if was_up else 'cold'})")
        yield Lab(docker_host=manager, engines=engines, was_up=was_up, up_s=up_s)
    finally:
        if not was_up:
            down = run_lab("down", timeout_s=300)
            assert down.returncode == 0, down.stderr


@pytest.fixture
def manager(lab: Lab) -> Iterator[Any]:
    client = docker.DockerClient(base_url=lab.docker_host, version="auto", timeout=60)
    yield client
    client.close()


@contextlib.contextmanager
def engine(base_url: str) -> Iterator[Any]:
    client = docker.APIClient(base_url=base_url, version="auto", timeout=60)
    try:
        yield client
    finally:
        client.close()


def lab_nodes(manager: Any) -> dict[str, Any]:
    """Lab node name → docker-py Node, by the io.sandvisor.lab.node label."""
    nodes = manager.nodes.list()
    by_name = {n.attrs["Spec"].get("Labels", {}).get("io.sandvisor.lab.node"): n for n in nodes}
    assert set(by_name) == set(HOSTNAMES), [n.attrs["Spec"] for n in nodes]
    return by_name


def node_state(manager: Any, node_id: str) -> str:
    return str(manager.api.inspect_node(node_id)["Status"]["State"])


def test_three_ready_nodes_with_roles_and_labels(lab: Lab, manager: Any) -> None:
    nodes = lab_nodes(manager)
    assert len(manager.nodes.list()) == 3  # no stale nodes of earlier joins
    for name, node in nodes.items():
        attrs = node.attrs
        assert attrs["Status"]["State"] == "ready", (name, attrs["Status"])
        assert attrs["Spec"]["Availability"] == "active"
        assert attrs["Description"]["Hostname"] == HOSTNAMES[name]
        assert attrs["Spec"]["Role"] == ("manager" if name == "manager" else "worker")
        labels = attrs["Spec"]["Labels"]
        # The engine the node advertises is that node's own: its swarm node id says so.
        assert labels["io.sandvisor.engine"] == lab.engines[name]
        with engine(labels["io.sandvisor.engine"]) as node_engine:
            info = node_engine.info()
        assert info["Swarm"]["NodeID"] == node.id
        assert info["Name"] == HOSTNAMES[name]
        assert info["LiveRestoreEnabled"] is False  # swarm mode refuses live-restore
        if name == "w2":
            assert labels.get("sandbox") == "gvisor"
            assert info["DefaultRuntime"] == "runsc"
            assert info["Runtimes"]["runsc"]["runtimeArgs"] == ["--network=none"]
        else:
            assert "sandbox" not in labels
            assert info["DefaultRuntime"] == "runc"
            assert "runsc" not in info["Runtimes"]
        for image in ("sandvisor/minimal:latest", "sandvisor/debian:latest"):
            with engine(labels["io.sandvisor.engine"]) as node_engine:
                assert node_engine.inspect_image(image)["Id"]
    assert nodes["manager"].attrs["ManagerStatus"]["Leader"] is True


def test_up_again_is_a_no_op(lab: Lab, manager: Any) -> None:
    before = {name: node.id for name, node in lab_nodes(manager).items()}
    start = time.monotonic()
    up = run_lab("up", timeout_s=UP_TIMEOUT_S)
    took = time.monotonic() - start
    assert up.returncode == 0, up.stderr
    assert up.stdout.splitlines()[-1] == f"DOCKER_HOST={lab.docker_host}"
    assert "starting" not in up.stderr and "joins" not in up.stderr, up.stderr
    after = {name: node.id for name, node in lab_nodes(manager).items()}
    assert after == before
    print(f"\nswarm-lab up on a running lab: {took:.1f} s")
    status = run_lab("status")
    assert status.returncode == 0, status.stderr
    for hostname in HOSTNAMES.values():
        assert hostname in status.stdout


def test_job_pinned_to_the_gvisor_node_runs_under_runsc(lab: Lab, manager: Any) -> None:
    gvisor = lab_nodes(manager)["w2"]
    service = manager.services.create(
        "sandvisor/minimal:latest",
        command=["uname", "-r"],
        name=f"sandvisor-lab-test-{os.getpid()}",
        mode=ServiceMode("replicated-job", replicas=1),
        constraints=["node.labels.sandbox==gvisor"],
        restart_policy=RestartPolicy(condition="none"),
        labels={"io.sandvisor.test": str(os.getpid())},
    )
    container_id = ""
    try:

        def task() -> dict[str, Any] | None:
            tasks = manager.api.tasks(filters={"service": service.id})
            return tasks[0] if tasks else None

        def finished() -> bool:
            t = task()
            return t is not None and t["Status"]["State"] in ("complete", "failed", "rejected")

        took = poll_until(finished, 120, "the job's task to finish")
        t = task()
        assert t is not None
        assert t["Status"]["State"] == "complete", t["Status"]
        assert t["NodeID"] == gvisor.id
        container_id = t["Status"]["ContainerStatus"]["ContainerID"]
        assert t["Status"]["ContainerStatus"]["ExitCode"] == 0
        # No cluster-level inspect or logs: the node's own engine, from its label.
        with engine(gvisor.attrs["Spec"]["Labels"]["io.sandvisor.engine"]) as node_engine:
            inspect = node_engine.inspect_container(container_id)
            release = node_engine.logs(container_id).decode().strip()
        assert inspect["HostConfig"]["Runtime"] == "runsc"
        assert inspect["Config"]["Labels"]["com.docker.swarm.node.id"] == gvisor.id
        # gVisor's own kernel answers uname, not the host's.
        assert release and release != os.uname().release, release
        print(f"\nreplicated-job on the gVisor node: complete after {took:.1f} s")
    finally:
        service.remove()
        if container_id:  # Engine 20.10 leaves a removed job's containers behind
            with (
                engine(lab.engines["w2"]) as node_engine,
                contextlib.suppress(docker.errors.NotFound),
            ):
                node_engine.remove_container(container_id, force=True)
    assert not manager.services.list(filters={"label": f"io.sandvisor.test={os.getpid()}"})


def test_cut_worker_goes_down_and_heal_brings_it_back(lab: Lab, manager: Any) -> None:
    w1 = lab_nodes(manager)["w1"].id
    cut = run_lab("cut", "w1")
    assert cut.returncode == 0, cut.stderr
    try:
        down_s = poll_until(lambda: node_state(manager, w1) == "down", NODE_DOWN_S, "w1 down")
        status = run_lab("status")
        assert status.returncode != 0  # not all three Ready
    finally:
        heal = run_lab("heal", "w1")
    assert heal.returncode == 0, heal.stderr
    ready_s = poll_until(lambda: node_state(manager, w1) == "ready", NODE_READY_S, "w1 ready")
    print(f"\ncut w1: Down after {down_s:.1f} s; heal: Ready after {ready_s:.1f} s")
    assert run_lab("status").returncode == 0


def test_drain_and_activate(lab: Lab, manager: Any) -> None:
    w1 = lab_nodes(manager)["w1"].id

    def availability() -> str:
        return str(manager.api.inspect_node(w1)["Spec"]["Availability"])

    try:
        assert run_lab("drain", "w1").returncode == 0
        assert availability() == "drain"
    finally:
        assert run_lab("activate", "w1").returncode == 0
    assert availability() == "active"
