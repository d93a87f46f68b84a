"""The wheel is the product: build it, install it into a fresh venv in a real non-root user's
home (outside the checkout), and follow the README's quick start as that user, with HOME set:
``--version``, ``doctor``, ``images build``, ``run``, ``run --bg``, ``logs``, ``stop``, a
project's ``run --policy dev`` then ``workspace changes``/``diff``/``apply``/``undo``/
``discard``, and MCP through the official ``mcp`` client (the one the wheel installed). Then
``uv tool install`` and ``pipx install`` of the same wheel, as the same user, everything they
write inside its home: the tool alone has the version, every policy, the image sources, and
runs a command on the engine.

Needs root (to create the user, ``tests/users.py``; CI is root): skipped only when not root. The daemon the
quick start autostarts is stopped at the end, by its pid (a tool install's daemon at the end
of its test, which then removes the tool's folder); the user is removed only if this test
created it."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.conftest import require_engine
from tests.users import HostUser, docker_group_user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
PIP = (sys.executable, "-m", "pip", "--disable-pip-version-check")
#: Never shipped (setup.py leaves them out of the wheel): image build scratch and caches.
NOT_SHIPPED = {".build", "__pycache__"}

MCP_CLIENT = """
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main() -> None:
    params = StdioServerParameters(command=sys.argv[1], args=["mcp"])
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = [t.name for t in (await session.list_tools()).tools]
        result = await session.call_tool(
            "bash", {"command": "echo from-mcp; id -u; cat hello.txt", "description": "mcp"}
        )
        text = "".join(c.text for c in result.content if c.type == "text")
        print(json.dumps({"tools": tools, "text": text, "is_error": getattr(result, "isError", getattr(result, "is_error", None))}))

asyncio.run(main())
"""


@dataclass
class User(HostUser):
    """The non-root user, its venv with the wheel installed, and how to run things as it.

    ``work`` holds the wheel and the wheelhouse of its dependencies (readable by the user).
    A copy with ``bin_dir`` and ``state`` set is the same user with a tool installer's
    ``sandvisor`` and a state directory of its own (``$SANDVISOR_STATE_DIR`` in ``env``)."""

    venv: Path = Path()
    wheel: Path = Path()
    wheelhouse: Path = Path()
    work: Path = Path()
    daemon_pids: set[int] = field(default_factory=set)
    bin_dir: Path | None = None
    state: Path | None = None

    @property
    def sandvisor(self) -> str:
        return str((self.bin_dir or self.venv / "bin") / "sandvisor")

    @property
    def state_dir(self) -> Path:
        return self.state or self.home / ".local" / "state" / "sandvisor"

    @property
    def python(self) -> Path:
        """The interpreter the venv was made with (the user ran it: it can execute it)."""
        return Path(os.path.realpath(self.venv / "bin" / "python"))

    def run(
        self, *argv: str, cwd: Path | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        result = super().run(*argv, cwd=cwd, timeout=timeout)
        for pid in re.findall(r"started one in the background \(pid (\d+)", result.stderr):
            self.daemon_pids.add(int(pid))
        return result

    def cli(self, *args: str, cwd: Path | None = None, timeout: float = 120) -> str:
        """``sandvisor ARGS`` as the user; its stdout (it must exit 0)."""
        return self.ok(self.sandvisor, *args, cwd=cwd, timeout=timeout)


def _root_run(*argv: str, timeout: float = 300) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)
    return done.stdout


def _uid_of(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
    return int(match.group(1)) if match else None


def _stop_daemon(user: User) -> None:
    """SIGTERM the daemons the quick start started (by pid, only if they are the user's)."""
    info = user.state_dir / "daemon" / "daemon.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        user.daemon_pids.add(int(json.loads(info.read_text())["pid"]))
    for pid in sorted(user.daemon_pids):
        if _uid_of(pid) != user.uid:
            continue
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _uid_of(pid) == user.uid and time.monotonic() < deadline:
            time.sleep(0.1)
        if _uid_of(pid) == user.uid:
            os.kill(pid, signal.SIGKILL)


def _leftovers(pids: set[int]) -> list[str]:
    """Containers the user's daemons made that are still on the engine."""
    import docker  # noqa: PLC0415

    client = docker.APIClient(version="auto", timeout=30)
    try:
        rows = []
        for pid in pids:
            rows += client.containers(all=True, filters={"label": f"io.sandvisor.owner.pid={pid}"})
        for row in rows:
            client.remove_container(row["Id"], force=True)
        return [row["Names"][0] for row in rows]
    finally:
        client.close()


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    with docker_group_user() as host:
        require_engine()
        work = Path(tempfile.mkdtemp(prefix="sandvisor-wheel-"))
        work.chmod(0o755)  # the user installs from here
        try:
            # The wheel, and a wheelhouse of its dependencies (from pip's cache when it has them).
            dist, wheelhouse = work / "dist", work / "wheelhouse"
            _root_run(*PIP, "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO))
            [wheel] = dist.glob("sandbox_supervisor-*.whl")
            _root_run(*PIP, "wheel", "-q", "-w", str(wheelhouse), str(wheel))
            for path in work.rglob("*"):
                path.chmod(0o755 if path.is_dir() else 0o644)
            venv = host.home / "venv"
            env = {**host.env, "PATH": f"{venv}/bin:{host.env['PATH']}"}
            u = User(
                **{**vars(host), "env": env},
                venv=venv,
                wheel=wheel,
                wheelhouse=wheelhouse,
                work=work,
            )
            shutil.rmtree(u.state_dir, ignore_errors=True)  # a previous run's, if any
            shutil.rmtree(venv, ignore_errors=True)
            u.ok("python3", "-m", "venv", str(venv))
            u.ok(
                str(venv / "bin" / "pip"),
                "install",
                "-q",
                "--no-index",
                "--find-links",
                str(wheelhouse),
                str(wheel),
                timeout=240,
            )
            try:
                yield u
            finally:
                _stop_daemon(u)
                left = _leftovers(u.daemon_pids)
                assert left == [], f"the user's daemon left containers behind: {left}"
        finally:
            shutil.rmtree(work, ignore_errors=True)


def test_the_installed_wheel_has_its_policies_images_and_version(user: User) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert user.cli("--version") == f"sandvisor {project['version']}\n"
    site = next((user.venv / "lib").glob("python3*/site-packages"))
    assert (site / "supervisor" / "_data" / "policies" / "dev.toml").is_file()
    names = [p["name"] for p in json.loads(user.cli("policies", "list", "--json"))]
    assert names == sorted(p.stem for p in (REPO / "policies").glob("*.toml"))
    assert {"default", "dev", "untrusted"} <= set(names)
    # Nothing is imported from the checkout.
    where = user.ok(
        str(user.venv / "bin" / "python"), "-c", "import supervisor; print(supervisor.__file__)"
    )
    assert where.startswith(str(site))

    doctor = json.loads(user.cli("doctor", "--json"))
    checks = {c["name"]: c for c in doctor["checks"]}
    assert doctor["ready"], doctor
    assert checks["policies"]["facts"]["shipped"] == str(site / "supervisor" / "_data" / "policies")
    assert checks["image dev"]["facts"]["up_to_date"] is True  # hashed from the wheel's sources
    built = user.cli("images", "build", timeout=240)
    assert re.search(r"^\[dev\] up to date: sandvisor/dev:[0-9a-f]{12}", built, re.MULTILINE), built


def test_quick_start_run_background_logs_stop(user: User) -> None:
    first = user.run(user.sandvisor, "run", "--", "echo", "hello from a sandbox")
    assert first.returncode == 0, (first.stdout, first.stderr)
    assert first.stdout == "hello from a sandbox\n"
    assert user.daemon_pids, first.stderr  # the first command started the daemon
    info = json.loads((user.state_dir / "daemon" / "daemon.json").read_text())
    assert _uid_of(int(info["pid"])) == user.uid  # a non-root daemon

    out = user.cli(
        "run", "--bg", "--", "sh", "-c", "for i in 1 2 3; do echo tick $i; done; sleep 600"
    )
    task_id = out.splitlines()[0]
    assert re.fullmatch(r"bg-[0-9a-z]+", task_id), out
    user.cli("wait", task_id, "--pattern", "tick 3", "--timeout", "30s")
    assert user.cli("logs", task_id) == "tick 1\ntick 2\ntick 3\n"
    user.cli("stop", task_id)
    [row] = [t for t in json.loads(user.cli("ps", "--json")) if t["task_id"] == task_id]
    assert row["status"] == "killed", row


def test_quick_start_workspace_review_apply_undo_discard(user: User) -> None:
    project = user.home / "myproject"
    user.ok("mkdir", "-p", str(project))
    user.ok("sh", "-c", "printf 'hello\\n' > hello.txt", cwd=project)

    out = user.cli(
        "run",
        "--policy",
        "dev",
        "--",
        "sh",
        "-c",
        "echo changed >> hello.txt && echo new > new.txt && id -u",
        cwd=project,
    )
    assert out == f"{user.uid}\n"  # tasks on the project run as its owner
    assert (project / "hello.txt").read_text() == "hello\n"  # nothing on the host yet
    changes = json.loads(user.cli("workspace", "changes", "--json", cwd=project))
    assert {c["path"]: c["kind"] for c in changes} == {"hello.txt": "modified", "new.txt": "added"}
    diff = user.cli("workspace", "diff", cwd=project)
    assert " hello\n+changed\n" in diff and "+++ b/new.txt" in diff, diff

    applied = user.cli("workspace", "apply", cwd=project)
    assert applied.startswith("applied 2 change(s)"), applied
    assert (project / "hello.txt").read_text() == "hello\nchanged\n"
    assert (project / "new.txt").read_text() == "new\n"
    for name in ("hello.txt", "new.txt"):
        st = (project / name).stat()
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid), name

    user.cli("workspace", "undo", cwd=project)
    assert (project / "hello.txt").read_text() == "hello\n"
    assert not (project / "new.txt").exists()

    user.cli("run", "--policy", "dev", "--", "sh", "-c", "echo scratch > scratch.txt", cwd=project)
    assert [
        c["path"] for c in json.loads(user.cli("workspace", "changes", "--json", cwd=project))
    ] == ["scratch.txt"]
    user.cli("workspace", "discard", cwd=project)
    assert user.cli("workspace", "changes", "--json", cwd=project) == "[]\n"
    assert sorted(p.name for p in project.iterdir()) == ["hello.txt"]
    user.cli("session", "end", cwd=project)


def test_quick_start_mcp_through_the_official_client(user: User) -> None:
    project = user.home / "myproject"
    out = user.ok(
        str(user.venv / "bin" / "python"),
        "-c",
        MCP_CLIENT,
        user.sandvisor,
        cwd=project,
        timeout=120,
    )
    answer = json.loads(out.splitlines()[-1])
    assert "bash" in answer["tools"] and not answer["is_error"], answer
    assert f"from-mcp\n{user.uid}\nhello\n" in answer["text"], answer


def _digests(folder: Path) -> dict[str, str]:
    """The sha256 of every file under ``folder``, by relative path, but what is never shipped."""
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in folder.rglob("*")
        if path.is_file()
        and not NOT_SHIPPED & set(path.relative_to(folder).parts)
        and path.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def installers(user: User) -> Iterator[dict[str, list[str]]]:
    """``uv tool install`` and ``pipx install`` as the user can run them.

    uv's binary (the one this venv has) is copied where the user can read it: the test venv
    may live under a 0700 /root. pipx goes into a venv of the user's own, made with the
    interpreter of the user's venv, from a wheelhouse of this venv's pipx version."""
    import uv  # noqa: PLC0415

    uv_bin = user.work / "uv"
    shutil.copyfile(uv.find_uv_bin(), uv_bin)
    uv_bin.chmod(0o755)
    toolhouse = user.work / "toolhouse"
    _root_run(*PIP, "wheel", "-q", "-w", str(toolhouse), f"pipx=={version('pipx')}")
    for path in [toolhouse, *toolhouse.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    venv = user.home / "pipx-venv"
    shutil.rmtree(venv, ignore_errors=True)
    try:
        user.ok(str(user.python), "-m", "venv", str(venv))
        pip = str(venv / "bin" / "pip")
        user.ok(pip, "install", "-q", "--no-index", "--find-links", str(toolhouse), "pipx")
        yield {
            "uv": [str(uv_bin), "tool", "install"],
            "pipx": [str(venv / "bin" / "pipx"), "install"],
        }
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def _tool_install(user: User, installer: str, command: list[str], root: Path) -> Path:
    """``installer`` installs the wheel as the user: offline (the wheelhouse), with the
    interpreter of the user's venv, every file it writes under ``root`` (the tool's venv,
    ``root/bin/sandvisor``, caches). The tool's venv."""
    env = {**user.env, "XDG_CACHE_HOME": str(root / "cache")}
    wheel, wheelhouse = str(user.wheel), str(user.wheelhouse)
    if installer == "uv":
        env |= {
            "UV_TOOL_DIR": str(root / "tools"),
            "UV_TOOL_BIN_DIR": str(root / "bin"),
            "UV_PYTHON_DOWNLOADS": "never",
        }
        argv = [*command, "--no-config", "--python", str(user.python)]
        argv += ["--no-index", "--find-links", wheelhouse, wheel]
        venv = root / "tools" / "sandbox-supervisor"
    else:
        env |= {
            "PIPX_HOME": str(root / "pipx"),
            "PIPX_BIN_DIR": str(root / "bin"),
            "PIPX_MAN_DIR": str(root / "man"),
            # Offline it cannot reinstall pip in its shared libraries: it keeps the
            # interpreter's (ensurepip's), as on any host without an index.
            "PIPX_DISABLE_SHARED_LIBS_AUTO_UPGRADE": "1",
        }
        argv = [*command, "--python", str(user.python)]
        argv += ["--pip-args", f"--no-index --find-links {wheelhouse}", wheel]
        venv = root / "pipx" / "venvs" / "sandbox-supervisor"
    dataclasses.replace(user, env=env).ok(*argv, timeout=240)
    return venv


@pytest.mark.parametrize("installer", ["uv", "pipx"])
def test_a_tool_install_of_the_wheel_has_everything_and_runs(
    user: User, installers: dict[str, list[str]], installer: str
) -> None:
    """``uv tool install`` / ``pipx install`` of the wheel: the tool alone (only its bin dir on
    PATH, a state directory of its own, so its own daemon) has the version, every shipped
    policy, the image sources byte for byte, and runs a command in a sandbox."""
    root = user.home / f"tool-{installer}"
    shutil.rmtree(root, ignore_errors=True)
    user.ok("mkdir", str(root))
    tool: User | None = None
    try:
        venv = _tool_install(user, installer, installers[installer], root)
        assert Path(os.path.realpath(venv / "bin" / "python")) == user.python
        env = {
            **user.env,
            "PATH": f"{root / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "SANDVISOR_STATE_DIR": str(root / "state"),
        }
        tool = dataclasses.replace(
            user, venv=venv, env=env, bin_dir=root / "bin", state=root / "state"
        )
        assert Path(os.path.realpath(tool.sandvisor)) == venv / "bin" / "sandvisor"

        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        assert tool.cli("--version") == f"sandvisor {project['version']}\n"
        site = next((venv / "lib").glob("python3*/site-packages"))
        where = tool.ok(
            str(venv / "bin" / "python"), "-c", "import supervisor; print(supervisor.__file__)"
        )
        assert where.startswith(str(site / "supervisor")), where
        data = site / "supervisor" / "_data"
        for name in ("policies", "sandbox_images"):
            assert _digests(data / name) == _digests(REPO / name), name
        names = [p["name"] for p in json.loads(tool.cli("policies", "list", "--json"))]
        assert names == sorted(p.stem for p in (REPO / "policies").glob("*.toml"))
        assert tool.cli("images", "build", "--help").startswith("usage: sandvisor images build")
        # Hashed from the tool's copy of the sources: the engine's images were built from them.
        images = {i["name"]: i["state"] for i in json.loads(tool.cli("images", "list", "--json"))}
        assert images == {"minimal": "yes", "debian": "yes", "dev": "yes"}, images

        ran = tool.run(tool.sandvisor, "run", "--", "echo", "hi")
        assert (ran.returncode, ran.stdout) == (0, "hi\n"), ran.stderr
        pid = int(json.loads((tool.state_dir / "daemon" / "daemon.json").read_text())["pid"])
        assert pid in tool.daemon_pids, ran.stderr  # this command started it
        assert _uid_of(pid) == user.uid
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert argv0.startswith(f"{venv}/"), argv0  # the tool's own daemon
    finally:
        if tool is not None:
            _stop_daemon(tool)
        shutil.rmtree(root, ignore_errors=True)
