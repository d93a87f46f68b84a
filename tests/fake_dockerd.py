"""A stand-in for dockerd, for the tests of ``sandvisor doctor --fix-engine``'s decisions and
restart (no Docker, no root): a small HTTP server on a unix socket that answers ``/_ping``,
``/containers/json`` and ``/version``, writes its pid file and removes it on SIGTERM (and,
like dockerd, refuses to start while its pid file names a process that exists).

Its program is called ``dockerd``: :class:`FakeDockerd` runs it through a symlink named
``dockerd`` to this Python interpreter, so ``/proc/<pid>/cmdline`` starts with
``<dir>/dockerd``, as engine.sh's ``our_pid`` and doctor want, and re-executing that command
line (what the restart does) runs this script again.

    fake = FakeDockerd(tmp_path)          # socket, pid file, log under tmp_path
    fake.start(); fake.freeze(); ...; fake.close()
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import re
import signal
import socketserver
import subprocess
import sys
import time
from pathlib import Path

VERSION = "99.1.0-fake"


def _serve(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pidfile", required=True)
    parser.add_argument("-H", dest="host", required=True)
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--exit-if", default=None, help="exit 3 at start when this file exists")
    args = parser.parse_args(argv)
    if args.exit_if and os.path.exists(args.exit_if):
        print("fake dockerd: told to fail", flush=True)
        sys.exit(3)
    pidfile = Path(args.pidfile)
    with contextlib.suppress(OSError, ValueError):
        old = int(pidfile.read_text().strip())
        if os.path.exists(f"/proc/{old}"):
            print(f"fake dockerd: pid file found, process {old} still running", flush=True)
            sys.exit(1)
    sock = args.host.removeprefix("unix://")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.path = re.sub(r"^/v[0-9.]+/", "/", self.path)  # docker-py's versioned paths
            if self.path == "/_ping":
                body, kind = b"OK", "text/plain"
            elif self.path.startswith("/containers/json"):
                body, kind = b"[]", "application/json"
            elif self.path == "/version":
                body = json.dumps({"Version": VERSION, "ApiVersion": "1.45"}).encode()
                kind = "application/json"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = socketserver.UnixStreamServer(sock, Handler)

    def stop(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            pidfile.unlink()
        with contextlib.suppress(OSError):
            os.unlink(sock)
        os._exit(0)

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else stop)
    pidfile.write_text(str(os.getpid()))
    print(f"fake dockerd {os.getpid()} listening on {sock}", flush=True)
    server.serve_forever()


def _state(pid: int) -> str:
    """The process state letter (R, S, T, Z, ...), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def wait_for(check: object, timeout_s: float, what: str) -> None:
    """Until ``check()`` is true, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout_s} s")
        time.sleep(0.02)


class FakeDockerd:
    """One fake dockerd under ``root``: ``start()``, ``freeze()``, ``close()``. It also
    stops a copy the code under test started again (by the pid in its pid file)."""

    def __init__(self, root: Path, *, run_dir: Path | None = None, extra: tuple[str, ...] = ()):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.program = self.bin / "dockerd"
        if not self.program.exists():
            self.program.symlink_to(os.path.realpath(sys.executable))
        self.run_dir = run_dir or root / "run"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.pidfile = self.run_dir / "dockerd.pid"
        self.socket = root / "docker.sock"
        self.docker_host = f"unix://{self.socket}"
        self.log = root / "dockerd.log"
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.others: list[int] = []

    def argv(self) -> list[str]:
        return [
            str(self.program),
            str(Path(__file__).resolve()),
            "--pidfile",
            str(self.pidfile),
            "-H",
            self.docker_host,
            *self.extra,
        ]

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        wait_for(lambda: self.socket.exists() and self.pidfile.exists(), 10, "fake dockerd up")

    def state(self, pid: int | None = None) -> str:
        return _state(self.pid if pid is None else pid)

    def freeze(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        wait_for(lambda: self.state() == "T", 5, "fake dockerd stopped")

    def pidfile_pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Stop the fake and any copy started again (its pid file names it)."""
        again = self.pidfile_pid()
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            self.proc.wait(timeout=10)
        mine = self.proc.pid if self.proc else None
        for pid in {p for p in (again, *self.others) if p is not None and p != mine}:
            try:
                ours = Path(f"/proc/{pid}/cmdline").read_bytes().startswith(bytes(self.program))
            except OSError:
                continue
            if ours:  # a copy of this fake (started again by the code under test)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                wait_for(lambda p=pid: _state(p) in ("", "Z"), 10, f"pid {pid} gone")


if __name__ == "__main__":
    _serve(sys.argv[1:])
