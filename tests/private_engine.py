"""A private Docker engine for tests that must not touch the shared one.

Starts its own ``dockerd`` (and, through it, its own containerd) with everything under a
fresh folder in /tmp: config file, data root, exec root, pid file, API socket, containerd
namespaces. Tests use it through ``Supervisor(docker_host=engine.docker_host)``.

Use the fixtures by naming this module as a plugin of the test module (importing the
fixture functions also works, but then ruff sees every test argument as a redefinition)::

    pytest_plugins = ("tests.private_engine",)
    pytest.register_assert_rewrite("tests.private_engine")  # before importing from it
    from tests.private_engine import EngineConfig, PrivateEngine

    async def test_x(private_engine: PrivateEngine) -> None:          # default config
        async with Supervisor(docker_host=private_engine.docker_host, ...) as sup: ...

    @pytest.mark.parametrize("private_engine", [EngineConfig(live_restore=True)], indirect=True)
    async def test_y(private_engine: PrivateEngine) -> None:
        private_engine.restart()                                       # same data, new dockerd

    def test_z(private_engine_factory) -> None:
        broken = private_engine_factory(EngineConfig(runtimes={"runsc": {"path": "/bin/false"}}))

Why not ``--bridge none`` (the flag DESIGN.md lists): dockerd 20.10 started with it
*deletes the host's ``docker0`` interface* (``removeDefaultBridgeInterface``), which breaks
the default bridge network of the shared engine. The private engine gets a bridge of its
own (``svpe<hex>``, created here and deleted on teardown) and never touches iptables.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.conftest import require_engine

DEFAULT_IMAGES = ("sandvisor/minimal:latest", "sandvisor/debian:latest")


@dataclass(frozen=True)
class EngineConfig:
    """How to run a private engine."""

    live_restore: bool = False
    """``live-restore`` in its daemon config: containers survive a restart of this dockerd."""
    runtimes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Extra OCI runtimes (``daemon.json`` ``runtimes``). Empty: runc only, no runsc."""
    images: tuple[str, ...] = DEFAULT_IMAGES
    """Images copied from the shared engine with ``docker save | docker load``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More ``daemon.json`` keys."""
    start_timeout_s: float = 60.0
    """How long dockerd may take to answer."""
    dockerd: str = "dockerd"
    """The dockerd binary: another engine version than the installed one (the engine
    stress bench runs Debian 12's 20.10 this way, unpacked from its package)."""


def _wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, interval: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s} s")
        time.sleep(interval)


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in state T (stopped by a signal)."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state == "T" for state in states)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive (our own children are reaped by Popen.wait()).
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.255.0.0/16 that no host route uses."""
    out = subprocess.run(
        ["ip", "-4", "-o", "route", "show", "table", "all"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    used = []
    for line in out.splitlines():
        dest = line.split()[0] if line.split() else ""
        with contextlib.suppress(ValueError):
            used.append(ipaddress.ip_network(dest if "/" in dest else f"{dest}/32", strict=False))
    for third in secrets.SystemRandom().sample(range(1, 255), 254):
        net = ipaddress.ip_network(f"10.255.{third}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free /24 in 10.255.0.0/16 for the private engine's bridge")


class PrivateEngine:
    """One private dockerd. ``start()``/``stop()``/``restart()``/``kill()``; ``close()``
    removes its containers, stops it and deletes its folder and bridge."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig()
        # Short: unix socket paths (exec root + containerd sockets) must stay < 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="svpe-", dir="/tmp"))
        tag = secrets.token_hex(3)
        self.namespace = f"svpe-{tag}"
        self.bridge = f"svpe{tag}"
        self.socket = self.root / "docker.sock"
        self.docker_host = f"unix://{self.socket}"
        self.pidfile = self.root / "dockerd.pid"
        self.log_path = self.root / "dockerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None
        #: A dockerd of this engine that another process started (see :meth:`adopt`).
        self.adopted: int | None = None
        self._bridge_up = False
        self.frozen = False
        self._write_config()

    def __str__(self) -> str:
        return self.docker_host

    # -- lifecycle ----------------------------------------------------------------------

    def _write_config(self) -> None:
        config: dict[str, Any] = {
            "live-restore": self.config.live_restore,
            "log-driver": "json-file",
            "runtimes": dict(self.config.runtimes),
        }
        config.update(self.config.extra)
        (self.root / "daemon.json").write_text(json.dumps(config, indent=2))

    def _ensure_bridge(self) -> None:
        if self._bridge_up:
            return
        net = _free_subnet()
        gateway = f"{next(net.hosts())}/{net.prefixlen}"
        subprocess.run(["ip", "link", "add", "name", self.bridge, "type", "bridge"], check=True)
        self._bridge_up = True
        subprocess.run(["ip", "addr", "add", gateway, "dev", self.bridge], check=True)
        subprocess.run(["ip", "link", "set", self.bridge, "up"], check=True)

    def argv(self) -> list[str]:
        return [
            self.config.dockerd,
            "--config-file",
            str(self.root / "daemon.json"),
            "--data-root",
            str(self.root / "data"),
            "--exec-root",
            str(self.root / "exec"),
            "--pidfile",
            str(self.pidfile),
            "-H",
            self.docker_host,
            "--containerd-namespace",
            self.namespace,
            "--containerd-plugins-namespace",
            f"{self.namespace}-plugins",
            "--bridge",
            self.bridge,
            "--iptables=false",
            "--ip-masq=false",
            "--ip-forward=false",
        ]

    def start(self) -> None:
        """Start dockerd and wait until its API answers."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self._ensure_bridge()
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        finally:
            log.close()
        self.pid = self.proc.pid

        def answers() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"private dockerd exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            return self.ping()

        _wait_until(answers, self.config.start_timeout_s, "private dockerd answering")

    def ping(self) -> bool:
        try:
            client = docker.APIClient(base_url=self.docker_host, version="auto", timeout=5)
        except Exception:
            return False
        try:
            return bool(client.ping())
        except Exception:
            return False
        finally:
            client.close()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM this dockerd (only it), then SIGKILL after ``timeout_s``."""
        self._signal_and_wait(signal.SIGTERM, timeout_s)

    def kill(self) -> None:
        """SIGKILL this dockerd: a crash, for engine-restart tests."""
        self._signal_and_wait(signal.SIGKILL, 10.0)

    def restarted_pid(self) -> int | None:
        """The pid of a dockerd of this engine that another process started (its pid file
        names it, and it is not this object's own), or None."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        own = self.proc.pid if self.proc is not None else self.adopted
        cmdline = _cmdline(pid)
        mine = cmdline.startswith("dockerd ") and f" {self.pidfile} " in cmdline
        return pid if pid != own and mine and _pid_alive(pid) else None

    def adopt(self, pid: int) -> None:
        """This engine's dockerd was started again by another process, with the same command
        line (``sandvisor doctor --fix-engine``): from now on stop, kill, freeze and close
        act on ``pid`` (it must be a dockerd of this engine's folder)."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"its own dockerd (pid {self.proc.pid}) is still running")
        cmdline = _cmdline(pid)
        if not (cmdline.startswith("dockerd ") and f" {self.pidfile} " in cmdline):
            raise RuntimeError(f"pid {pid} is not this engine's dockerd: {cmdline!r}")
        self.proc = None
        self.pid = self.adopted = pid
        self.frozen = False

    def _signal_and_wait(self, sig: signal.Signals, timeout_s: float) -> None:
        proc = self.proc
        if proc is None and self.adopted is not None:
            pid, self.adopted = self.adopted, None
            if _pid_alive(pid):
                os.kill(pid, sig)
                with contextlib.suppress(TimeoutError):
                    _wait_until(lambda: not _pid_alive(pid), timeout_s, f"dockerd {pid} exiting")
                if _pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
                    _wait_until(lambda: not _pid_alive(pid), 10, f"dockerd {pid} killed")
            return
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP this dockerd (only it): a wedged engine. Its socket still takes
        connections (the kernel queues them) but nothing answers; its containers run on."""
        pid = None
        if self.proc is not None and self.proc.poll() is None:
            pid = self.proc.pid
        elif self.adopted is not None and _pid_alive(self.adopted):
            pid = self.adopted
        if pid is None:
            return
        os.kill(pid, signal.SIGSTOP)
        self.frozen = True
        # SIGSTOP reaches a many-threaded dockerd's threads one by one: until the last one
        # stops, /proc still says R and a request may still be answered.
        _wait_until(lambda: _all_threads_stopped(pid), 10, f"dockerd {pid} stopped")

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        elif self.adopted is not None and _pid_alive(self.adopted):
            os.kill(self.adopted, signal.SIGCONT)
        self.frozen = False

    def restart(self) -> None:
        """Stop and start again on the same data root (live-restore decides what survives)."""
        self.stop()
        self.start()

    def client(self) -> Any:
        """A docker-py low-level client for this engine (close it when done)."""
        return docker.APIClient(base_url=self.docker_host, version="auto", timeout=120)

    def load_images(self, images: tuple[str, ...] | None = None) -> None:
        """Copy images from the shared engine: ``docker save | docker load``."""
        for image in images if images is not None else self.config.images:
            save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
            try:
                load = subprocess.run(
                    ["docker", "-H", self.docker_host, "load", "-q"],
                    stdin=save.stdout,
                    capture_output=True,
                    check=False,
                    timeout=300,
                )
            finally:
                if save.stdout is not None:
                    save.stdout.close()
                save_rc = save.wait(timeout=300)
            if save_rc != 0 or load.returncode != 0:
                raise RuntimeError(
                    f"copying {image} to the private engine failed: save exit {save_rc}, "
                    f"load exit {load.returncode}: {load.stderr.decode(errors='replace')}"
                )

    def remove_containers(self) -> int:
        """Force-remove every container of this (private) engine; returns how many."""
        if not self.ping():
            return 0
        client = self.client()
        try:
            rows = client.containers(all=True)
            for row in rows:
                with contextlib.suppress(docker.errors.NotFound):
                    client.remove_container(row["Id"], force=True, v=True)
            return len(rows)
        finally:
            client.close()

    def close(self) -> None:
        """Remove containers, stop dockerd and whatever it left running, delete the folder
        and the bridge. Only processes of this engine are signalled: this dockerd by its pid,
        then any containerd or shim whose command line names this engine's unique folder."""
        try:
            if self.frozen:  # a test that failed while the engine was stopped
                self.thaw()
            again = self.restarted_pid()
            if again is not None:  # started again by the code under test, never adopted
                self.adopt(again)
            if self.proc is not None and self.proc.poll() is not None:
                # Killed by the test and not restarted: start it once more so it can remove
                # the containers it still has (live-restore keeps them running meanwhile).
                with contextlib.suppress(Exception):
                    self.start()
            with contextlib.suppress(Exception):
                self.remove_containers()
            self.stop()
            # With live-restore dockerd leaves its containerd (and the shims) running.
            for pid in self._leftover_pids():
                _terminate(pid)
        finally:
            if self._bridge_up:
                subprocess.run(["ip", "link", "del", self.bridge], check=False)
                self._bridge_up = False
            self._remove_root()

    def _leftover_pids(self) -> list[int]:
        """containerd / shim processes started for this engine (they name its folder)."""
        marker = str(self.root) + "/"
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                cmdline = _cmdline(int(name))
                if marker in cmdline and "containerd" in cmdline.split(" ")[0]:
                    out.append(int(name))
        return sorted(out)

    def _remove_root(self) -> None:
        prefix = str(self.root) + "/"
        mounts = [
            line.split()[1]
            for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[1].startswith(prefix)
        ]
        for target in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _terminate(pid: int) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(TimeoutError):
        _wait_until(lambda: not _pid_alive(pid), 15, f"process {pid} to exit")
    if _pid_alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _can_run_private_engine() -> str | None:
    if os.geteuid() != 0:
        return "a private dockerd needs root"
    for tool in ("dockerd", "docker", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


@contextlib.contextmanager
def running_engine(config: EngineConfig | None = None) -> Iterator[PrivateEngine]:
    """A started private engine with its images loaded; torn down on exit."""
    engine = PrivateEngine(config)
    try:
        engine.start()
        engine.load_images()
        yield engine
    finally:
        engine.close()


def _require() -> None:
    require_engine()  # the images come from the shared engine
    problem = _can_run_private_engine()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs a private engine: {problem}", pytrace=False)
        pytest.skip(problem)


@pytest.fixture
def private_engine(request: pytest.FixtureRequest) -> Iterator[PrivateEngine]:
    """A private engine; configure it with ``indirect`` parametrization (an EngineConfig)."""
    _require()
    config = getattr(request, "param", None) or EngineConfig()
    with running_engine(config) as engine:
        yield engine


@pytest.fixture
def private_engine_factory() -> Iterator[Callable[[EngineConfig], PrivateEngine]]:
    """Start as many private engines as a test needs; all are torn down after it."""
    _require()
    stack = contextlib.ExitStack()

    def make(config: EngineConfig) -> PrivateEngine:
        return stack.enter_context(running_engine(config))

    with stack:
        yield make
